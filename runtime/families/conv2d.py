"""Host-side rules of the int8 conv2d family (OPS.md "Packed int8 activations", family 2).

Three jobs, all pure torch / Python:

- geometry: `conv2d_params` turns PyTorch-style conv arguments into a frozen
  `Conv2dParams` (output size, groups, pointwise / depthwise / im2col flags);
- epilogue: `conv2d_output_bounds`, the int8 bounds that apply relu and hardtanh as
  a clamp of the quantized output;
- device rules: `prefers_im2col` and `choose_algorithm` (OPS.md rules 1-2,
  rule 1 widened to groups == 1 at any C_in (docs/int8_cnn_ops.md "Channel
  padding"), and the dispatcher op's choice, the cooperative-matrix GEMMs
  included; conv2d_layouts.py resolves the ``PACKED_INT8_CONV2D`` placeholder
  with them);
- weight formats: the int8 weight packings the GEMM, direct and depthwise
  shaders read, returned as int32 words (4 int8 bytes each, little-endian;
  an ivec4 is 4 consecutive words).

It must not touch Vulkan or cache anything (the op stubs cache packed weights
per weight tensor), and it does not validate op arguments beyond what the
geometry needs (the op specs' checks do that). Called by the conv op stubs,
the conv references in runtime/reference/conv2d.py, and the tests.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch

from runtime.families.conv2d_tiling import prefers_coop_gemm
from runtime.reference.quantize import quantize_per_tensor
from runtime.vulkan.device import GPU_FAMILIES

ACTIVATIONS = ("none", "relu", "hardtanh", "hardswish")
INT8_MIN, INT8_MAX = -128, 127
IM2COL_MIN_GROUP_CHANNELS = 32
IM2COL_MAX_OUTPUT_PIXELS = 4096
# Pointwise convs of at most this many input channels run the direct conv on NVIDIA: their K
# (C_in / 4 words) is too short for the GEMM's staging to pay. H200 (session 29 `runtime tune`
# at batch 1, benchmarks/NOTES.md): the squeeze-and-excite expansions 4, 6, 8, 10 and 20 ->
# 96-480 channels on 1x1 maps 3.5-4.0 µs against pw's 4.6 (8 -> 32 7.9 against 9.9), 16 -> 96
# at 112x112 6.8 against 7.9; at batch 32 the same 16 -> 96 98.1 against 113.6 (session 28's
# conv2d_bench). From 24 channels pw was as fast or faster (24 -> 144 at 56x56, 32 -> 16 at
# 112x112).
POINTWISE_DIRECT_MAX_C_IN = 20
# q8ta_gemm_coop_im2col keeps tap coordinates in 16 bits: H + 2 * pad_y and W + 2 * pad_x must
# stay below this (the op's check coop_im2col_extent in op_specs/conv2d.yaml says the same).
COOP_IM2COL_EXTENT = 32768


def conv_output_size(size: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """PyTorch's conv output size: ``(size + 2p - d*(k-1) - 1) // s + 1``."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _pair(value, name: str) -> tuple[int, int]:
    """An int or a list of 1 or 2 ints, as PyTorch's conv arguments, to (y, x)."""
    items = [value] if isinstance(value, int) else list(value)
    if len(items) not in (1, 2) or not all(isinstance(v, int) for v in items):
        raise ValueError(f"{name} must be an int or a list of 1 or 2 ints, got {value!r}")
    return (items[0], items[-1])


@dataclass(frozen=True)
class Conv2dParams:
    """The geometry of one 2-D convolution (NCHW input, OIHW weights).

    ``stride``, ``padding`` and ``dilation`` are (y, x) pairs. ``Cg`` and
    ``Coutg`` are the input and output channels of one group.
    """

    N: int
    C_in: int
    H: int
    W: int
    C_out: int
    KH: int
    KW: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    Cg: int
    Coutg: int
    H_out: int
    W_out: int

    @property
    def taps(self) -> int:
        """Kernel taps ``KH * KW``."""
        return self.KH * self.KW

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        """``(N, C_out, H_out, W_out)``."""
        return (self.N, self.C_out, self.H_out, self.W_out)

    @property
    def Kg(self) -> int:
        """Reduction length of one group: ``Cg * KH * KW``."""
        return self.Cg * self.taps

    @property
    def is_pointwise(self) -> bool:
        """1x1 kernel, stride 1, padding 0, and whole channel words per group."""
        return (
            (self.KH, self.KW) == (1, 1)
            and self.stride == (1, 1)
            and self.padding == (0, 0)
            and (self.groups == 1 or self.Cg % 4 == 0)
        )

    @property
    def is_depthwise(self) -> bool:
        """One input and one output channel per group: ``groups == C_in == C_out``."""
        return self.groups == self.C_in == self.C_out

    @property
    def direct_word_span(self) -> int:
        """``NW`` of `pack_direct_weights`: the most input channel words a group touches."""
        return direct_word_span(self.C_in, self.groups)

    @property
    def fixed_kernel(self) -> tuple[int, int]:
        """(KW, KH) as the direct and depthwise shaders' spec constants FIXED_KW, FIXED_KH (loops
        the driver can unroll) up to 7x7: every torchvision CNN's kernels but AlexNet's 11x11
        stem, which gets (0, 0) and reads them from push constants."""
        return (self.KW, self.KH) if self.KH * self.KW <= 49 else (0, 0)

    @property
    def fixed_word_span(self) -> int:
        """`direct_word_span` as the direct shader's spec constant FIXED_NW up to 16 words, else 0
        (read from push constants)."""
        return self.direct_word_span if self.direct_word_span <= 16 else 0

    @property
    def gemm_group_channels(self) -> int:
        """Input channels of a group per tap in the im2col GEMMs' K: ``Cg`` rounded up to whole
        channel words (4), the padding channels' weights 0 (docs/int8_cnn_ops.md "Channel
        padding")."""
        return _ceil4(self.Cg) * 4

    @property
    def gemm_k(self) -> int:
        """K bytes of a group in the im2col and pointwise GEMMs: ``gemm_group_channels * KH * KW``."""
        return self.gemm_group_channels * self.taps

    @property
    def im2col_eligible(self) -> bool:
        """OPS.md rule 1, widened: ``(C_in / groups) % 4 == 0`` or one group. A group of whole
        channel words is a run of words of the packed input; one group of any C_in reads its
        padding channels too, times the zero weights of `gemm_group_channels`."""
        return self.Cg % 4 == 0 or self.groups == 1

    @property
    def im2col_coop_eligible(self) -> bool:
        """``q8ta_conv2d_im2col_coop`` accepts it: im2col-eligible, one group, and tap
        coordinates within 16 bits (`COOP_IM2COL_EXTENT`)."""
        return (self.im2col_eligible and self.groups == 1
                and self.H + 2 * self.padding[0] < COOP_IM2COL_EXTENT
                and self.W + 2 * self.padding[1] < COOP_IM2COL_EXTENT)


def conv2d_params(x_shape, weight_shape, kernel_size, stride, padding, dilation, groups) -> Conv2dParams:
    """Builds the geometry of a conv from PyTorch-style arguments.

    Args:
        x_shape: input shape ``[N, C_in, H, W]``.
        weight_shape: weight shape ``[C_out, C_in/groups, KH, KW]``.
        kernel_size, stride, padding, dilation: an int or a list of 1 or 2 ints.
        groups: number of groups; divides C_in and C_out.

    Returns:
        The `Conv2dParams`.

    Raises:
        ValueError: the shapes and arguments do not describe a valid conv.
    """
    if len(x_shape) != 4 or len(weight_shape) != 4:
        raise ValueError(f"conv2d needs 4-D input and weights, got {list(x_shape)} and {list(weight_shape)}")
    n, c_in, h, w = (int(s) for s in x_shape)
    c_out, cg, kh, kw = (int(s) for s in weight_shape)
    if not isinstance(groups, int) or groups < 1 or c_in % groups or c_out % groups:
        raise ValueError(f"groups={groups!r} must be a positive int dividing C_in={c_in} and C_out={c_out}")
    if cg != c_in // groups:
        raise ValueError(f"weights have {cg} input channels per group, expected C_in/groups = {c_in // groups}")
    if _pair(kernel_size, "kernel_size") != (kh, kw):
        raise ValueError(f"kernel_size={kernel_size!r} does not match the weights' {kh}x{kw}")
    sy, sx = _pair(stride, "stride")
    py, px = _pair(padding, "padding")
    dy, dx = _pair(dilation, "dilation")
    if min(sy, sx, dy, dx, kh, kw) < 1 or min(py, px) < 0:
        raise ValueError("stride, dilation and kernel size must be >= 1 and padding >= 0")
    h_out = conv_output_size(h, kh, sy, py, dy)
    w_out = conv_output_size(w, kw, sx, px, dx)
    if h_out < 1 or w_out < 1:
        raise ValueError(f"the output would be {h_out}x{w_out}: the kernel does not fit the input")
    return Conv2dParams(
        N=n, C_in=c_in, H=h, W=w, C_out=c_out, KH=kh, KW=kw, stride=(sy, sx), padding=(py, px),
        dilation=(dy, dx), groups=groups, Cg=cg, Coutg=c_out // groups, H_out=h_out, W_out=w_out,
    )


def conv2d_output_bounds(activation: str, activation_min: float, activation_max: float,
                         output_scale: float, output_zero_point: int) -> tuple[int, int]:
    """The int8 bounds ``(lo, hi)`` the conv epilogue clamps its quantized output to.

    quantize (``clamp(roundEven(y * fp32(1/output_scale)) + zp, -128, 127)``)
    is monotonic, so ``quantize(clamp(y, a, b)) == clamp(quantize(y),
    quantize(a), quantize(b))``: relu (``a = 0, b = +inf``) and hardtanh
    (``a, b`` = the fp32 values of ``activation_min, activation_max``) become
    a clamp of the int8 result by bounds quantized exactly as the epilogue
    quantizes. "none" and "hardswish" clamp to the int8 range only.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if activation == "relu":
        bounds = (0.0, float("inf"))
    elif activation == "hardtanh":
        bounds = (activation_min, activation_max)
    else:
        return (INT8_MIN, INT8_MAX)
    q = quantize_per_tensor(torch.tensor(bounds, dtype=torch.float32), output_scale,
                            output_zero_point, INT8_MIN, INT8_MAX, torch.int8)
    return (int(q[0]), int(q[1]))


def check_family(family: str) -> None:
    """Raises `ValueError` unless `family` is one of `GPU_FAMILIES`."""
    if family not in GPU_FAMILIES:
        raise ValueError(f"unknown GPU family {family!r}; use one of {', '.join(GPU_FAMILIES)}")


def prefers_im2col(params: Conv2dParams, family: str) -> bool:
    """OPS.md rule 2: whether im2col (rather than direct convolution) serves ``params``.

    On mali: whenever eligible. Elsewhere: eligible, one group, and either
    at least 32 input channels or at most 4096 output pixels.
    """
    check_family(family)
    if not params.im2col_eligible:
        return False
    if family == "mali":
        return True
    return params.groups == 1 and (
        params.Cg >= IM2COL_MIN_GROUP_CHANNELS
        or params.H_out * params.W_out <= IM2COL_MAX_OUTPUT_PIXELS
    )


def choose_algorithm(params: Conv2dParams, family: str, coop: Collection[str] = ()) -> str:
    """The algorithm ``etvk.q8ta_conv2d.default`` runs with nothing measured: "pw", "dw",
    "im2col" or "general" by the family's rule, or "pw_coop" / "im2col_coop". Pointwise convs
    take pw, on NVIDIA the direct conv ("general") up to `POINTWISE_DIRECT_MAX_C_IN` input
    channels.

    `coop` names the GEMM kernels ("pw", "im2col") the device runs on cooperative matrices.
    Where the shape suits them (`conv2d_tiling.prefers_coop_gemm` over `Conv2dParams.gemm_k`),
    pw moves to pw_coop, and im2col or general to im2col_coop (`im2col_coop_eligible`):
    rule 2 weighs the im2col scratch's round trip against the direct conv, and the implicit
    im2col of the coop GEMM makes none (a stem, 3 channels at 112x112 outputs, is direct by
    rule 2 and im2col_coop here).
    """
    check_family(family)
    if params.is_pointwise and params.groups == 1:
        rule = "general" if family == "nvidia" and params.C_in <= POINTWISE_DIRECT_MAX_C_IN else "pw"
    elif params.is_depthwise:
        return "dw"
    else:
        rule = "im2col" if prefers_im2col(params, family) else "general"
    kernel = "pw" if rule == "pw" else "im2col"
    eligible = rule == "pw" or params.im2col_coop_eligible
    m = params.N * params.H_out * params.W_out
    if kernel in coop and eligible and prefers_coop_gemm(kernel, m, params.gemm_k, params.C_out, params.groups):
        return f"{kernel}_coop"
    return rule


def _check_weights(w: torch.Tensor) -> None:
    if w.dtype != torch.int8 or w.dim() != 4:
        raise ValueError(f"weights must be an int8 [C_out, C_in/groups, KH, KW] tensor, "
                         f"got {w.dtype} {list(w.shape)}")


def _ceil4(n: int) -> int:
    return -(-n // 4)


def _words(blocks: torch.Tensor) -> torch.Tensor:
    """int8 blocks whose last dimension is 4 bytes, as flat int32 words."""
    return blocks.contiguous().view(torch.int32).reshape(-1)


def _gemm_rows(w: torch.Tensor) -> torch.Tensor:
    """``[C_out, Cg4 * KH * KW]``: each row ``w[oc]`` in K order ``k = (ky*KW + kx)*Cg4 + ic``
    (ic fastest), its input channels zero padded to ``Cg4 = ceil(Cg / 4) * 4`` per tap."""
    c_out, cg = w.shape[:2]
    padded = torch.nn.functional.pad(w, (0, 0, 0, 0, 0, _ceil4(cg) * 4 - cg))
    return padded.permute(0, 2, 3, 1).reshape(c_out, -1)


def pack_gemm_weights(w: torch.Tensor, groups: int) -> torch.Tensor:
    """Weights of the im2col / pointwise GEMM.

    Row ``oc`` is ``w[oc]`` in K order ``k = (ky*KW + kx)*Cg4 + ic`` (ic
    fastest), each tap's input channels zero padded to ``Cg4 = ceil(Cg / 4) *
    4``, so a row has ``Kg4 = Cg4 / 4 * KH * KW`` words and each word is one
    tap's 4 input channels (`Conv2dParams.gemm_k`). ivec4 ``oc4 * Kg4 + k4``
    holds in component ``j`` the word of row ``oc4*4 + j`` for K values
    ``4*k4 .. 4*k4+3`` (byte ``k % 4``); rows ``>= C_out`` are 0.

    Args:
        w: int8 ``[C_out, Cg, KH, KW]``.
        groups: the conv's groups (each row is its own group's K vector); with
            more than one, Cg must be a multiple of 4 (`Conv2dParams.im2col_eligible`).

    Returns:
        int32 ``[ceil(C_out/4) * Kg4 * 4]``.
    """
    _check_weights(w)
    c_out, cg = w.shape[:2]
    if groups < 1 or c_out % groups:
        raise ValueError(f"groups={groups} must divide C_out={c_out}")
    if groups > 1 and cg % 4:
        raise ValueError(f"the GEMM weights of {groups} groups need C_in/groups a multiple of 4, got {cg}")
    rows = _gemm_rows(w)
    o4, k4 = _ceil4(c_out), rows.shape[1] // 4
    rows = torch.nn.functional.pad(rows, (0, 0, 0, o4 * 4 - c_out))
    return _words(rows.reshape(o4, 4, k4, 4).permute(0, 2, 1, 3))


# q8ta_gemm_coop's tile of output channels, and the K bytes its weight rows are padded to (two of
# its 64-byte chunks; the shader reads only the chunks that hold K)
COOP_ROWS, COOP_K = 64, 128


def pack_gemm_coop_weights(w: torch.Tensor) -> torch.Tensor:
    """Weights of the cooperative-matrix GEMM (``q8ta_gemm_coop``; groups == 1).

    Row ``oc`` is ``w[oc]`` in K order ``k = (ky*KW + kx)*C4 + ic`` (ic
    fastest, input channels zero padded to ``C4 = ceil(C_in / 4) * 4`` per tap, as
    `pack_gemm_weights`: ``K = C4 * KH * KW``), zero padded to ``KP = ceil(K / 128) *
    128`` bytes (the shader's K chunk); rows are zero padded to a multiple of 64. Byte ``k`` of row
    ``oc`` is byte ``k % 4`` of word ``oc * KP / 4 + k / 4``.

    Args:
        w: int8 ``[C_out, C_in, KH, KW]``.

    Returns:
        int32 ``[ceil(C_out/64)*64 * KP/4]``.
    """
    _check_weights(w)
    c_out = w.shape[0]
    rows = _gemm_rows(w)
    k = rows.shape[1]
    kp = -(-k // COOP_K) * COOP_K
    n_pad = -(-c_out // COOP_ROWS) * COOP_ROWS
    return _words(torch.nn.functional.pad(rows, (0, kp - k, 0, n_pad - c_out)))


def direct_word_span(c_in: int, groups: int) -> int:
    """``NW``: the most input channel words one group's channels touch."""
    cg = c_in // groups
    return max(((g + 1) * cg - 1) // 4 - (g * cg) // 4 + 1 for g in range(groups))


def pack_direct_weights(w: torch.Tensor, groups: int, C_in: int) -> torch.Tensor:
    """Weights of the direct conv, laid out along the input's channel words.

    Output channel ``oc`` of group ``g`` reads input words ``first(g) =
    g*Cg // 4`` onwards. ivec4 ``(oc4*KH*KW + tap)*NW + i`` (``tap = ky*KW +
    kx``) holds in component ``j`` the weights of ``oc = oc4*4 + j`` for input
    channels ``ch = (first(g)+i)*4 + b`` in byte ``b``: ``w[oc, ch - g*Cg, ky,
    kx]`` where ``ch`` is in group ``g``, else 0; rows ``>= C_out`` are 0.

    Args:
        w: int8 ``[C_out, Cg, KH, KW]``.
        groups: the conv's groups.
        C_in: the input's channels, ``Cg * groups``.

    Returns:
        int32 ``[ceil(C_out/4) * KH*KW * NW * 4]``, where ``NW`` is
        `direct_word_span`.
    """
    _check_weights(w)
    c_out, cg, kh, kw = w.shape
    if groups < 1 or c_out % groups or C_in != cg * groups:
        raise ValueError(f"C_in={C_in} and C_out={c_out} do not fit groups={groups} "
                         f"with {cg} input channels per group")
    nw = direct_word_span(C_in, groups)
    o4, taps = _ceil4(c_out), kh * kw
    oc = torch.arange(o4 * 4)
    group = (oc // (c_out // groups)).clamp(max=groups - 1)
    ch = ((group * cg) // 4 * 4)[:, None] + torch.arange(nw * 4)[None, :]  # [O, NW*4]
    rel = ch - (group * cg)[:, None]
    valid = (rel >= 0) & (rel < cg) & (oc < c_out)[:, None]
    per_tap = torch.nn.functional.pad(w.permute(0, 2, 3, 1).reshape(c_out, taps, cg),
                                      (0, 0, 0, 0, 0, o4 * 4 - c_out))  # [O, T, Cg]
    index = rel.clamp(0, cg - 1)[:, None, :].expand(-1, taps, -1)
    picked = torch.gather(per_tap, 2, index) * valid[:, None, :].to(torch.int8)
    blocks = picked.reshape(o4, 4, taps, nw, 4).permute(0, 2, 3, 1, 4)
    return _words(blocks)


def pack_depthwise_weights(w: torch.Tensor) -> torch.Tensor:
    """Weights of the depthwise conv (``groups == C_in == C_out``).

    Taps ``T = KH*KW`` (``tap = ky*KW + kx``) are zero padded to ``T4 =
    ceil(T/4)`` words. ivec4 ``c4 * T4 + t4`` holds in component ``j`` the
    weights of channel ``c4*4 + j`` at taps ``4*t4 .. 4*t4+3``.

    Args:
        w: int8 ``[C, 1, KH, KW]``.

    Returns:
        int32 ``[ceil(C/4) * T4 * 4]``.
    """
    _check_weights(w)
    c, one, kh, kw = w.shape
    if one != 1:
        raise ValueError(f"depthwise weights need one input channel per group, got {one}")
    taps = kh * kw
    c4, t4 = _ceil4(c), _ceil4(taps)
    rows = torch.nn.functional.pad(w.reshape(c, taps), (0, t4 * 4 - taps, 0, c4 * 4 - c))
    return _words(rows.reshape(c4, 4, t4, 4).permute(0, 2, 1, 3))


# Conv1's output channels q8ta_conv2d_pw_pair keeps in its workgroup's shared memory (the op's
# check, and the pairing rewrite's, lower_conv_pair.py).
PW_PAIR_MAX_MID_CHANNELS = 4096


def pw_pair_max_mid_channels() -> int:
    """`PW_PAIR_MAX_MID_CHANNELS`, for the op spec's check."""
    return PW_PAIR_MAX_MID_CHANNELS


def pack_pw_pair_weights(w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Weights of q8ta_conv2d_pw_pair: conv1's `pack_gemm_weights` (``ceil(C_mid/4) *
    ceil(C_in/4)`` ivec4), then conv2's (``ceil(C_out/4) * ceil(C_mid/4)``), each 1x1 of
    groups 1.

    Returns:
        int32 ``[(ceil(C_mid/4) * ceil(C_in/4) + ceil(C_out/4) * ceil(C_mid/4)) * 4]``.
    """
    return torch.cat((pack_gemm_weights(w1, 1), pack_gemm_weights(w2, 1)))


def pack_pw_pair_channels(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """conv1's per-channel values (weight sums or scales) followed by conv2's, as one
    int32 vector (integer values) or fp32 vector (floating ones) for q8ta_conv2d_pw_pair."""
    dtype = torch.float32 if first.dtype.is_floating_point else torch.int32
    return torch.cat((first.reshape(-1), second.reshape(-1))).to(dtype)


def pack_pw_pair_biases(w1: torch.Tensor, w2: torch.Tensor, bias1: torch.Tensor | None,
                        bias2: torch.Tensor | None) -> torch.Tensor:
    """fp32 ``[C_mid + C_out]``: conv1's bias then conv2's, 0 for a conv without one (the
    epilogue adds 0 then, as without a bias; q8ta_conv2d_pw_pair)."""
    parts = [torch.zeros(w.shape[0], dtype=torch.float32) if b is None else b.reshape(-1).to(torch.float32)
             for w, b in ((w1, bias1), (w2, bias2))]
    return torch.cat(parts)


def weight_sums(w: torch.Tensor) -> torch.Tensor:
    """int32 ``[C_out]``: the sum of each output channel's weights."""
    _check_weights(w)
    return w.to(torch.int32).sum(dim=(1, 2, 3), dtype=torch.int32)
