"""Host-side geometry of the int8 pooling family (q8ta_pool).

Pure Python / torch, five jobs:

- `pool2d_params`: PyTorch-style pooling arguments (kernel_size, stride,
  padding, dilation as 1 or 2 ints, an empty stride meaning the kernel size,
  ceil_mode) to a frozen `Pool2dParams`, with PyTorch's output size rule;
- `avg_pool2d_divisors`: the divisor of every output pixel of
  ``avg_pool2d`` (count_include_pad, divisor_override and the windows that
  ceil_mode cuts at ``size + padding``), the table the shader computes per pixel;
- `adaptive_windows`: adaptive_avg_pool2d's window bounds along one axis;
- `global_pool_tiling`: how the global average pool's workgroups share the
  reduction over H*W;
- `cascade_sum`: PyTorch's CPU summation order, which the global pool follows.

It must not touch Vulkan nor check op arguments beyond what the geometry needs
(the op specs' checks name the bad argument). Called by the pool op stubs
(through runtime/ops/stub_support.py), the references in
runtime/reference/q8ta_pool.py, the examples and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from runtime.families.conv2d import _pair, conv_output_size

# Invocations of one global-pool workgroup (the shader's workgroup size).
GLOBAL_POOL_THREADS = 256


def pool_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int,
                     ceil_mode: bool) -> int:
    """PyTorch's pooling output size along one axis (may be < 1, which PyTorch rejects).

    ``floor_or_ceil((size + 2p - d*(k-1) - 1) / s) + 1`` (the conv formula, on
    ``size + s - 1`` for ceil_mode); with ceil_mode the last window must start
    inside the input or the left padding, else it is dropped.
    """
    out = conv_output_size(size + (stride - 1 if ceil_mode else 0), kernel, stride, padding, dilation)
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


@dataclass(frozen=True)
class Pool2dParams:
    """The geometry of one 2-D pooling of an NCHW input.

    ``stride``, ``padding`` and ``dilation`` are (y, x) pairs; ``H_out`` and
    ``W_out`` follow PyTorch's rule and are < 1 when PyTorch would reject the
    arguments ("output size is too small").
    """

    N: int
    C: int
    H: int
    W: int
    KH: int
    KW: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    H_out: int
    W_out: int


def pool2d_params(x_shape, kernel_size, stride, padding, dilation, ceil_mode) -> Pool2dParams:
    """Builds the geometry of a pooling from PyTorch-style arguments.

    Args:
        x_shape: input shape ``[N, C, H, W]``.
        kernel_size, padding, dilation: an int or a list of 1 or 2 ints.
        stride: the same, or an empty list for "equal to kernel_size".
        ceil_mode: PyTorch's ceil_mode.

    Returns:
        The `Pool2dParams` (its output size may be < 1; see there).

    Raises:
        ValueError: a malformed argument, or a kernel, stride or dilation < 1
            or a padding < 0.
    """
    if len(x_shape) != 4:
        raise ValueError(f"pooling needs a 4-D [N, C, H, W] input, got {list(x_shape)}")
    n, c, h, w = (int(s) for s in x_shape)
    kh, kw = _pair(kernel_size, "kernel_size")
    sy, sx = (kh, kw) if not isinstance(stride, int) and len(stride) == 0 else _pair(stride, "stride")
    py, px = _pair(padding, "padding")
    dy, dx = _pair(dilation, "dilation")
    if min(kh, kw, sy, sx, dy, dx) < 1 or min(py, px) < 0:
        raise ValueError("kernel_size, stride and dilation must be >= 1 and padding >= 0")
    return Pool2dParams(
        N=n, C=c, H=h, W=w, KH=kh, KW=kw, stride=(sy, sx), padding=(py, px), dilation=(dy, dx),
        ceil_mode=bool(ceil_mode),
        H_out=pool_output_size(h, kh, sy, py, dy, ceil_mode),
        W_out=pool_output_size(w, kw, sx, px, dx, ceil_mode),
    )


def _axis_divisors(size: int, out: int, kernel: int, stride: int, padding: int,
                   count_include_pad: bool) -> torch.Tensor:
    """Per output index along one axis: the window's length as avg_pool2d counts it.

    A window starts at ``o*stride - padding`` and ends at ``min(start + kernel,
    size + padding)``; without count_include_pad only its part inside
    ``[0, size)`` counts.
    """
    start = torch.arange(out, dtype=torch.int64) * stride - padding
    end = torch.clamp(start + kernel, max=size + padding)
    if count_include_pad:
        return end - start
    return torch.clamp(end, max=size) - torch.clamp(start, min=0)


def avg_pool2d_divisors(params: Pool2dParams, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor:
    """The divisor of every output pixel of avg_pool2d, int64 ``[H_out, W_out]``.

    ``divisor_override`` when given, else the product of the window's lengths
    along y and x (`_axis_divisors`). Every window holds at least one input
    pixel (PyTorch's padding and ceil_mode rules guarantee it).
    """
    shape = (params.H_out, params.W_out)
    if divisor_override is not None:
        return torch.full(shape, divisor_override, dtype=torch.int64)
    dy = _axis_divisors(params.H, params.H_out, params.KH, params.stride[0], params.padding[0],
                        count_include_pad)
    dx = _axis_divisors(params.W, params.W_out, params.KW, params.stride[1], params.padding[1],
                        count_include_pad)
    return dy[:, None] * dx[None, :]


def adaptive_windows(size: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """adaptive_avg_pool2d's windows along an axis of `size` to `out` outputs.

    Returns:
        int64 ``(start, end)`` of length `out`: output ``i`` covers
        ``[floor(i*size/out), ceil((i+1)*size/out))``.
    """
    i = torch.arange(out, dtype=torch.int64)
    return i * size // out, ((i + 1) * size + out - 1) // out


@dataclass(frozen=True)
class GlobalPoolTiling:
    """How `GLOBAL_POOL_THREADS` invocations of a workgroup share a global pool.

    ``words`` (a power of two dividing the workgroup) channel words per
    workgroup, each reduced over H*W by ``GLOBAL_POOL_THREADS // words``
    invocations: ``workers`` per stream of `cascade_sum`'s order; ``groups`` the
    workgroup counts.
    """

    words: int
    workers: int
    groups: tuple[int, int, int]


# Level-0 blocks of the cascade a global pool's worker sums per round (the shader's BLOCKS).
GLOBAL_POOL_BLOCKS = 4


def global_pool_tiling(x_shape) -> GlobalPoolTiling:
    """Tiling of a global pool over an ``[N, C, H, W]`` input: each stream of `cascade_sum`'s
    order (`CASCADE_STREAMS` a channel word) gets the fewest workers (1, 2, 4 or 8) that sum
    its whole level-0 blocks in one round of `GLOBAL_POOL_BLOCKS` each, so that large maps
    are summed block-parallel and small ones pack several words into a workgroup."""
    n, c, h, w = (int(d) for d in x_shape)
    _, _, items = cascade_shape(h * w)
    blocks = items >> cascade_level_power(items)
    workers = 1
    while workers * GLOBAL_POOL_BLOCKS < blocks and workers * CASCADE_STREAMS < GLOBAL_POOL_THREADS:
        workers *= 2
    words = GLOBAL_POOL_THREADS // (CASCADE_STREAMS * workers)
    return GlobalPoolTiling(words=words, workers=workers, groups=(-(-n * (-(-c // 4)) // words), 1, 1))


# PyTorch's CPU sum of a contiguous row of fp32 values (ATen's cascade_sum, SumKernel.cpp; the
# same bits under its AVX512, AVX2 and default kernels, checked on torch 2.13): rows of 8 values
# or more are read as vectors of CASCADE_LANES, and the vectors (or, for shorter rows, the
# values) by CASCADE_ILP interleaved accumulators, each a cascade of CASCADE_LEVELS partial sums
# that carry every 2**level_power items.
CASCADE_LANES = 8
CASCADE_ILP = 4
CASCADE_LEVELS = 4
CASCADE_STREAMS = CASCADE_LANES * CASCADE_ILP


def cascade_shape(length: int) -> tuple[int, int, int]:
    """(lanes, vectors, items) of a row of `length` values in the cascade order: CASCADE_LANES
    lanes (1 under a whole vector), ``length // lanes`` vectors and ``vectors // CASCADE_ILP``
    items a stream."""
    lanes = CASCADE_LANES if length >= CASCADE_LANES else 1
    vectors = length // lanes
    return lanes, vectors, vectors // CASCADE_ILP


def cascade_level_power(items: int) -> int:
    """log2 of the items a cascade level holds before it carries: ``max(4, CeilLog2(items) //
    4)``, with ATen's CeilLog2 (1 up to 2 items)."""
    ceil_log2 = 1 if items <= 2 else (items - 1).bit_length()
    return max(4, ceil_log2 // CASCADE_LEVELS)


def cascade_sum(values: torch.Tensor) -> torch.Tensor:
    """The fp32 sums of the rows of `values` (``[R, L]`` fp32) in PyTorch's CPU order (above):
    with V = CASCADE_LANES lanes for L >= V (else 1) and L // V vectors, stream (lane l,
    accumulator k) sums the lane-l values of vectors k, k + 4, ... (the first 4 * (L // V // 4))
    through the levels; lane l's total is its stream 0 plus the leftover vectors' lane-l
    values, then plus streams 1, 2 and 3; the row's sum is 0 plus the values past the last
    whole vector, then plus the lanes' totals in order. Each step one fp32 addition."""
    rows, length = values.shape
    lanes, vectors, items = cascade_shape(length)
    power = cascade_level_power(items)
    step = 1 << power
    mask = step - 1
    zero = torch.zeros(rows, dtype=torch.float32)  # never changed in place: shared freely
    total = zero
    for p in range(vectors * lanes, length):
        total = total + values[:, p]
    for lane in range(lanes):
        streams = []
        for k in range(CASCADE_ILP):
            def item(j, k=k, lane=lane):
                return values[:, (j * CASCADE_ILP + k) * lanes + lane]
            acc = [zero] * CASCADE_LEVELS
            j = 0
            while j + step <= items:
                for _ in range(step):
                    acc[0] = acc[0] + item(j)
                    j += 1
                for level in range(1, CASCADE_LEVELS):
                    acc[level] = acc[level] + acc[level - 1]
                    acc[level - 1] = zero
                    if j & (mask << (level * power)):
                        break
            while j < items:
                acc[0] = acc[0] + item(j)
                j += 1
            for level in range(1, CASCADE_LEVELS):
                acc[0] = acc[0] + acc[level]
            streams.append(acc[0])
        lane_total = streams[0]
        for v in range(items * CASCADE_ILP, vectors):
            lane_total = lane_total + values[:, v * lanes + lane]
        for k in range(1, CASCADE_ILP):
            lane_total = lane_total + streams[k]
        total = total + lane_total
    return total
