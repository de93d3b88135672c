"""Reference numerics of the q8ta_binary family: int8 add, mul and channel concat (also with
the per-channel tables of q8ta_unary read from it, composed).

Each op is PyTorch's decomposed path in fp32, step for step: every input is
dequantized as ``quantized_decomposed.dequantize_per_tensor`` does
(``float32(q - zero_point) * float32(scale)``), combined with the aten op
(``add``, ``mul`` with b broadcast over H and W, or ``cat`` along the
channels), passed through ``relu`` if asked, and quantized as
``quantized_decomposed.quantize_per_tensor`` does
(``clamp(round_half_even(y * float32(1.0 / output_scale)) + output_zero_point, -128, 127)``,
the reciprocal divided in float64). Every step rounds to fp32 once, so the
shaders (which evaluate the same steps with ``precise``) and PyTorch agree bit
for bit. The ``layout`` a device keeps the values in does not change them.

Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the arithmetic needs (the op stubs check arguments).
"""

from __future__ import annotations

import torch

from runtime.families.conv2d import ACTIVATIONS, INT8_MAX, INT8_MIN
from runtime.reference.q8ta_unary import q8ta_channel_lut
from runtime.reference.quantize import dequantize_per_tensor, quantize_per_tensor


def _real(q, scale, zero_point):
    """``float32(q - zero_point) * float32(scale)`` of int8 values."""
    return dequantize_per_tensor(q, scale, zero_point, INT8_MIN, INT8_MAX, torch.int8)


def _requantize(y, output_scale, output_zero_point):
    return quantize_per_tensor(y, output_scale, output_zero_point, INT8_MIN, INT8_MAX, torch.int8)


def _binary(combine, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
            output_scale, output_zero_point, activation):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    y = combine(_real(a, a_scale, a_zero_point), _real(b, b_scale, b_zero_point))
    if activation == "relu":
        y = torch.relu(y)
    return _requantize(y, output_scale, output_zero_point)


def q8ta_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, output_scale,
             output_zero_point, activation="none"):
    """int8 ``a + b`` (b of a's shape or ``[N, C, 1, 1]``), relu optional, requantized.

    Returns:
        int8 of ``a``'s shape.
    """
    return _binary(torch.add, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                   output_scale, output_zero_point, activation)


def q8ta_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, output_scale,
             output_zero_point, activation="none"):
    """int8 ``a * b`` (b of a's shape or ``[N, C, 1, 1]``), relu optional, requantized.

    Returns:
        int8 of ``a``'s shape.
    """
    return _binary(torch.mul, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                   output_scale, output_zero_point, activation)


def q8ta_concat(a, a_scale, a_zero_point, b, b_scale, b_zero_point, output_scale,
                output_zero_point):
    """int8 ``cat([a, b], dim=1)``, each input requantized to the output's qparams.

    Returns:
        int8 ``[N, C_a + C_b, H, W]``.
    """
    y = torch.cat([_real(a, a_scale, a_zero_point), _real(b, b_scale, b_zero_point)], dim=1)
    return _requantize(y, output_scale, output_zero_point)


def q8ta_concat_channel_lut(a, a_scale, a_zero_point, b, b_scale, b_zero_point, output_scale,
                            output_zero_point, table, sums=None, sums_table=None):
    """(`q8ta_concat`, ``q8ta_channel_lut`` of it through the int8 ``[C_a + C_b, 256]`` `table`,
    after the window sums' Cs channels where `sums` and `sums_table` are given).

    Returns:
        int8 ``[N, C_a + C_b, H, W]`` and ``[N, Cs + C_a + C_b, H, W]`` tensors.
    """
    concat = q8ta_concat(a, a_scale, a_zero_point, b, b_scale, b_zero_point, output_scale,
                         output_zero_point)
    return concat, q8ta_channel_lut(concat, table, sums, sums_table)
