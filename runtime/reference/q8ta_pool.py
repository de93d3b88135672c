"""Reference numerics of the int8 pooling family (q8ta_pool), the definition the shaders match.

- window sum: ``S = Σ q`` of the raw int8 values of each full window (no
  padding, floor mode), exact in int32: what a table over S reads
  (``q8ta_channel_lut``'s sums).
- max pool: the largest int8 value among a window's taps inside the image
  (padding taps never win); a window with no tap inside the image gives -128,
  as quantizing PyTorch's -inf does.
- average pools: ``S = Σ (q - input_zero_point)`` over the window's taps inside
  the image, exact in int32; then, in fp32, each step rounded once:
  ``a = float(S) * input_scale``, ``y = a / divisor`` (correctly rounded), and
  ``out = clamp(roundEven(y * float32(1 / output_scale)) + output_zero_point, -128, 127)``.
  The divisor is avg_pool2d's (`runtime.families.pool2d.avg_pool2d_divisors`),
  the window's taps for the adaptive pool (`runtime.families.pool2d.adaptive_windows`).
- global average pool: PyTorch's own mean of the dequantized values, bit for bit:
  ``(q - input_zero_point) * input_scale`` each rounded to fp32, summed in PyTorch's CPU
  order (`runtime.families.pool2d.cascade_sum`), divided by H*W, requantized as above.

The integer parts are computed exactly (integer-valued float64 or int64).
Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the geometry needs (the op stubs check arguments).
"""

from __future__ import annotations

import torch

from runtime.families.pool2d import (
    adaptive_windows,
    avg_pool2d_divisors,
    cascade_sum,
    pool2d_params,
)
from runtime.reference.quantize import fp32, quantize_per_tensor

INT8_MIN, INT8_MAX = -128, 127


def q8ta_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    """int8 max pooling with PyTorch's max_pool2d geometry.

    Returns:
        int8 ``[N, C, H_out, W_out]``.
    """
    # int8 values are exact in fp32; windows without an image tap give -inf.
    peak = torch.ops.aten.max_pool2d.default(x.to(torch.float32), list(kernel_size), list(stride),
                                             list(padding), list(dilation), ceil_mode)
    return peak.clamp_min(INT8_MIN).to(torch.int8)


def average(sums, divisors, input_scale, output_scale, output_zero_point):
    """The fp32 steps of the average pools on exact integer window sums.

    Args:
        sums: int64 ``Σ (q - input_zero_point)`` per output element.
        divisors: int64 divisors, broadcastable to ``sums``.

    Returns:
        int8 of ``sums``' shape.
    """
    a = sums.to(torch.float32) * torch.tensor(fp32(input_scale), dtype=torch.float32)
    y = a / divisors.to(torch.float32)
    return quantize_per_tensor(y, output_scale, output_zero_point, INT8_MIN, INT8_MAX, torch.int8)


def q8ta_avg_pool2d(x, input_scale, input_zero_point, output_scale, output_zero_point,
                    kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """int8 average pooling with PyTorch's avg_pool2d geometry and divisor.

    Returns:
        int8 ``[N, C, H_out, W_out]``.
    """
    params = pool2d_params(x.shape, kernel_size, stride, padding, [1], ceil_mode)
    centred = (x.to(torch.int64) - input_zero_point).to(torch.float64)
    # divisor_override=1: the plain sum of the taps inside the image (padding adds 0).
    sums = torch.ops.aten.avg_pool2d.default(centred, [params.KH, params.KW], list(params.stride),
                                             list(params.padding), ceil_mode, True, 1)
    divisors = avg_pool2d_divisors(params, count_include_pad, divisor_override)
    return average(sums.round().to(torch.int64), divisors, input_scale, output_scale,
                   output_zero_point)


def q8ta_window_sum(x, kernel_size, stride):
    """int32 sums of the raw int8 values of each full window (avg_pool2d's geometry, no padding,
    floor mode).

    Returns:
        int32 ``[N, C, H_out, W_out]``.
    """
    params = pool2d_params(x.shape, kernel_size, stride, [0], [1], False)
    sums = torch.ops.aten.avg_pool2d.default(x.to(torch.float64), [params.KH, params.KW], list(params.stride),
                                             [0, 0], False, True, 1)  # divisor_override=1: the sum
    return sums.round().to(torch.int32)


def q8ta_global_avg_pool2d(x, input_scale, input_zero_point, output_scale, output_zero_point):
    """int8 global average pooling, PyTorch's mean of the dequantized values: each value
    ``(q - input_zero_point) * input_scale`` rounded to fp32, summed in PyTorch's CPU order
    (`runtime.families.pool2d.cascade_sum`), divided by H*W (correctly rounded), requantized.

    Returns:
        int8 ``[N, C, 1, 1]``.
    """
    n, c, h, w = x.shape
    values = (x.to(torch.float32) - input_zero_point) * torch.tensor(fp32(input_scale), dtype=torch.float32)
    mean = cascade_sum(values.reshape(n * c, h * w)) / torch.tensor(float(h * w), dtype=torch.float32)
    return quantize_per_tensor(mean.reshape(n, c, 1, 1), output_scale, output_zero_point, INT8_MIN, INT8_MAX,
                               torch.int8)


def q8ta_adaptive_avg_pool2d(x, input_scale, input_zero_point, output_scale, output_zero_point,
                             output_size):
    """int8 adaptive average pooling with PyTorch's adaptive_avg_pool2d windows.

    Returns:
        int8 ``[N, C, H_out, W_out]``.
    """
    h_out, w_out = int(output_size[0]), int(output_size[-1])  # 1 or 2 ints
    centred = x.to(torch.int64) - input_zero_point
    # prefix sums with a leading 0 row / column: a window's sum is four lookups
    table = torch.nn.functional.pad(centred.cumsum(2).cumsum(3), (1, 0, 1, 0))
    (ya, yb), (xa, xb) = adaptive_windows(x.shape[2], h_out), adaptive_windows(x.shape[3], w_out)
    sums = (table[:, :, yb[:, None], xb[None, :]] - table[:, :, ya[:, None], xb[None, :]]
            - table[:, :, yb[:, None], xa[None, :]] + table[:, :, ya[:, None], xa[None, :]])
    divisors = (yb - ya)[:, None] * (xb - xa)[None, :]
    return average(sums, divisors, input_scale, output_scale, output_zero_point)
