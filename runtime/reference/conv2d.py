"""Reference numerics of the int8 conv2d family (OPS.md family 2) and its quantize ops.

``q8ta_conv2d`` is the definition the conv shaders match: the integer
accumulation is exact (integer values in float64, where every partial sum is
an exact integer), the epilogue is fp32 in the order OPS.md gives, rounding is
half-to-even and clamping happens in floating point. ``q8ta_quantize`` and
``q8ta_dequantize`` are the per-tensor quantize family with the int8 range;
their ``layout`` argument only says where the device keeps the values.

Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the geometry needs (the op stubs check arguments).
"""

from __future__ import annotations

import torch

from runtime.families.conv2d import ACTIVATIONS, INT8_MAX, INT8_MIN, conv2d_params
from runtime.reference.q8ta_binary import q8ta_add
from runtime.reference.q8ta_unary import q8ta_lut
from runtime.reference.quantize import dequantize_per_tensor, fp32, fp32_recip, quantize_per_tensor
from runtime.vulkan.layouts import check_layout

# hardswish's 1/6 as the fp32 constant the shaders multiply by (0x3E2AAAAB).
HARDSWISH_SIXTH = fp32(1.0 / 6.0)


def conv2d_accumulators(x, input_zero_point, weights, stride, padding, dilation, groups):
    """The exact integer sums ``Σ x * w`` of a conv, int64 ``[N, C_out, H_out, W_out]``.

    Taps outside the image read ``input_zero_point``. The products are summed as
    integer-valued float64, which is exact far beyond any int32 accumulator.
    """
    py, px = padding
    padded = torch.nn.functional.pad(x.to(torch.float64), (px, px, py, py), value=float(input_zero_point))
    acc = torch.nn.functional.conv2d(
        padded, weights.to(torch.float64), stride=stride, dilation=dilation, groups=groups
    )
    return acc.round().to(torch.int64)


def activate(y, activation, activation_min=0.0, activation_max=6.0):
    """The conv activation on the fp32 conv output ``y``, every step rounded to fp32.

    relu ``max(y, 0)``; hardtanh ``clamp(y, fp32(activation_min), fp32(activation_max))``;
    hardswish ``(y * clamp(y + 3, 0, 6)) * fp32(1/6)``; none ``y``.
    """
    if activation == "relu":
        return torch.clamp_min(y, 0.0)
    if activation == "hardtanh":
        return torch.clamp(y, fp32(activation_min), fp32(activation_max))
    if activation == "hardswish":
        return (y * torch.clamp(y + 3.0, 0.0, 6.0)) * HARDSWISH_SIXTH
    return y


def epilogue_values(acc, input_scale, input_zero_point, weight_sums, weight_scales, bias):
    """The fp32 values y of OPS.md family 2's epilogue, before activation and rounding.

    ``y = float32(acc - izp*wsum[oc]) * (float32(input_scale) * weight_scales[oc]) + bias[oc]``
    on int64 accumulators whose dimension 1 is the output channel (``[N, C_out, H, W]``
    for the convs, ``[M, N_out]`` for q8ta_linear); each operation rounds to fp32.
    """
    per_channel = (1, -1) + (1,) * (acc.dim() - 2)
    sums = weight_sums.to(torch.int64).reshape(per_channel)
    corrected = (acc - input_zero_point * sums).to(torch.float32)
    scales = torch.tensor(fp32(input_scale), dtype=torch.float32) * weight_scales.to(torch.float32)
    y = corrected * scales.reshape(per_channel)
    if bias is not None:
        y = y + bias.to(torch.float32).reshape(per_channel)
    return y


def requantize(acc, input_scale, input_zero_point, weight_sums, weight_scales,
               output_scale, output_zero_point, bias, activation,
               activation_min=0.0, activation_max=6.0):
    """The fp32 epilogue of OPS.md family 2 on int64 accumulators (channels in dimension 1).

    ``y`` of `epilogue_values`, ``y = activate(y, activation, activation_min, activation_max)``,
    then ``out = clamp(roundEven(y * float32(1/output_scale)) + output_zero_point, -128, 127)``.
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    y = epilogue_values(acc, input_scale, input_zero_point, weight_sums, weight_scales, bias)
    y = activate(y, activation, activation_min, activation_max)
    q = torch.round(y * fp32_recip(output_scale)) + output_zero_point
    return q.clamp(INT8_MIN, INT8_MAX).to(torch.int8)


def q8ta_conv2d(x, input_scale, input_zero_point, weights, weight_sums, weight_scales,
                output_scale, output_zero_point, bias, kernel_size, stride, padding,
                dilation, groups, activation, activation_min=0.0, activation_max=6.0,
                residual=None, residual_scale=1.0, residual_zero_point=0,
                add_output_scale=1.0, add_output_zero_point=0, add_activation="none", lut=None):
    """int8 conv2d with per-tensor activations and per-channel symmetric weights.

    Args follow the family 2 schema: ``x`` int8 ``[N, C_in, H, W]``, ``weights``
    int8 ``[C_out, C_in/groups, KH, KW]``, ``weight_sums`` int32 ``[C_out]``,
    ``weight_scales`` fp32 ``[C_out]``, ``bias`` fp32 ``[C_out]`` or None,
    ``kernel_size``/``stride``/``padding``/``dilation`` lists of 1 or 2 ints,
    ``activation`` one of `ACTIVATIONS`, ``activation_min``/``activation_max``
    the bounds of hardtanh (ignored by the other activations). With a
    ``residual`` (int8 of the output's shape) the conv's int8 output goes on
    through ``q8ta_add(out, output_scale, output_zero_point, residual,
    residual_scale, residual_zero_point, add_output_scale,
    add_output_zero_point, add_activation)`` (the epilogue's residual add);
    without one the ``residual_*`` and ``add_*`` arguments are ignored. With
    a ``lut`` (int8 ``[256]``) it goes through ``q8ta_lut(out, lut)`` instead
    (the epilogue's lookup table; the ops refuse a residual with it).

    Returns:
        int8 ``[N, C_out, H_out, W_out]``.
    """
    params = conv2d_params(x.shape, weights.shape, kernel_size, stride, padding, dilation, groups)
    acc = conv2d_accumulators(x, input_zero_point, weights, params.stride, params.padding,
                              params.dilation, groups)
    out = requantize(acc, input_scale, input_zero_point, weight_sums, weight_scales,
                     output_scale, output_zero_point, bias, activation, activation_min,
                     activation_max)
    if lut is not None:
        return q8ta_lut(out, lut)
    if residual is None:
        return out
    return q8ta_add(out, output_scale, output_zero_point, residual, residual_scale,
                    residual_zero_point, add_output_scale, add_output_zero_point, add_activation)


def q8ta_conv2d_pw_pair(x, input_scale, input_zero_point, weights, weight_sums, weight_scales, bias,
                        activation, activation_min, activation_max, lut, mid_scale, mid_zero_point,
                        input_scale2, input_zero_point2, weights2, weight_sums2, weight_scales2, bias2,
                        activation2, activation2_min, activation2_max, lut2, output_scale,
                        output_zero_point):
    """Two 1x1 convs (stride 1, padding 0, groups 1), the second reading the first's int8
    output (qparams ``(mid_scale, mid_zero_point)``, then its ``lut`` if any) with the qparams
    ``(input_scale2, input_zero_point2)``: `q8ta_conv2d` twice.

    Returns:
        int8 ``[N, C_out, H, W]``.
    """
    mid = q8ta_conv2d(x, input_scale, input_zero_point, weights, weight_sums, weight_scales,
                      mid_scale, mid_zero_point, bias, 1, 1, 0, 1, 1, activation, activation_min,
                      activation_max, lut=lut)
    return q8ta_conv2d(mid, input_scale2, input_zero_point2, weights2, weight_sums2, weight_scales2,
                       output_scale, output_zero_point, bias2, 1, 1, 0, 1, 1, activation2,
                       activation2_min, activation2_max, lut=lut2)


def _check_nchw(t: torch.Tensor, what: str) -> None:
    if t.dim() != 4:
        raise ValueError(f"{what} must be a 4-D [N, C, H, W] tensor, got {list(t.shape)}")


def q8ta_quantize(input, scale, zero_point, layout=None):
    """Per-tensor quantize to int8 [-128, 127] (bit-identical to quantize_per_tensor).

    Returns:
        int8 of ``input``'s shape; ``layout`` (None or one of `PACKED_LAYOUTS`)
        does not change the values.
    """
    if layout is not None:
        check_layout(layout)
    _check_nchw(input, "input")
    return quantize_per_tensor(input, scale, zero_point, INT8_MIN, INT8_MAX, torch.int8)


def q8ta_dequantize(input, scale, zero_point, layout=None, *, out_dtype=None):
    """Per-tensor dequantize of int8 values: ``float32(q - zero_point) * float32(scale)``.

    Returns:
        ``out_dtype`` (fp32 by default) of ``input``'s shape; ``layout`` (None or
        one of `PACKED_LAYOUTS`) does not change the values.
    """
    if layout is not None:
        check_layout(layout)
    _check_nchw(input, "input")
    return dequantize_per_tensor(input, scale, zero_point, INT8_MIN, INT8_MAX, torch.int8,
                                 out_dtype=out_dtype)
