"""Reference numerics of the quantize family (OPS.md family 1).

All arithmetic is fp32 in the order the shaders use: fp16 inputs are widened
exactly first, reciprocals are correctly rounded, rounding is half-to-even and
clamping happens in floating point before the integer conversion. Called by
the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the tests; it must
not import anything from the Vulkan side.
"""

from __future__ import annotations

import math
import struct

import torch

_FP32_EPS = torch.finfo(torch.float32).eps


def fp32(x: float) -> float:
    """Rounds a Python float to the nearest fp32 value (overflow gives ±inf)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def fp16(x: float) -> float:
    """Rounds a Python float to the nearest fp16 value, ties to even (overflow gives ±inf)."""
    try:
        return struct.unpack("<e", struct.pack("<e", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def fp32_recip(scale: float) -> float:
    """The fp32 reciprocal PyTorch uses for ``input * (1.0 / scale)`` on fp32 input.

    The division happens in float64 and the product rounds the scalar to fp32.
    For an fp32-representable scale this equals the correctly rounded
    ``float32(1) / float32(scale)`` of OPS.md.
    """
    return fp32(1.0 / scale)


def _token_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as [tokens, last_dim]; a 0-d tensor is one token of one value."""
    last = t.shape[-1] if t.dim() else 1
    return t.reshape(-1, last)


def _to_int(q: torch.Tensor, quant_min: int, quant_max: int, dtype: torch.dtype) -> torch.Tensor:
    """Clamps rounded fp32 values in floating point, then converts saturating."""
    clamped = q.clamp(quant_min, quant_max)
    return clamped.to(torch.int64).clamp(quant_min, quant_max).to(dtype)


def _int32_wrap(t: torch.Tensor) -> torch.Tensor:
    """Reduces int64 values to int32 two's complement, as the shader's int arithmetic does."""
    return (t + 2**31).remainder(2**32) - 2**31


def quantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype):
    """q = clamp(roundEven(x * inv_scale) + zero_point, quant_min, quant_max)."""
    x = input.to(torch.float32)
    q = torch.round(x * fp32_recip(scale)) + zero_point
    return _to_int(q, quant_min, quant_max, dtype)


def quantize_per_token(input, scales, zero_points, quant_min, quant_max, dtype):
    """Per-token quantize with inv_scale = float32(1) / float32(scale) per token."""
    if input.numel() == 0:
        return torch.empty(input.shape, dtype=dtype)
    x = _token_rows(input.to(torch.float32))
    s = scales.reshape(-1, 1).to(torch.float32)
    inv_scale = torch.ones_like(s) / s
    zp = zero_points.reshape(-1, 1).to(torch.int64).to(torch.float32)
    q = torch.round(x * inv_scale) + zp
    return _to_int(q, quant_min, quant_max, dtype).reshape(input.shape)


def dequantize_per_tensor(input, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    """x = float32(q - zero_point) * float32(scale), then converted to out_dtype."""
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    diff = _int32_wrap(input.to(torch.int64) - zero_point)
    return (diff.to(torch.float32) * fp32(scale)).to(out_dtype)


def dequantize_per_token(input, scales, zero_points, quant_min, quant_max, dtype, output_dtype):
    """x = float32(q - zero_points[token]) * float32(scales[token])."""
    if input.numel() == 0:
        return torch.empty(input.shape, dtype=output_dtype)
    q = _token_rows(input.to(torch.int64))
    zp = zero_points.reshape(-1, 1).to(torch.int64)
    s = scales.reshape(-1, 1).to(torch.float32)
    x = _int32_wrap(q - zp).to(torch.float32) * s
    return x.to(output_dtype).reshape(input.shape)


def choose_qparams_per_token_asymmetric(input, dtype):
    """Asymmetric int8 scale and zero point per token, in PyTorch's fp32 order.

    Returns fp32 scales and int32 zero points of shape ``input.shape[:-1] + (1,)``.
    """
    shape = tuple(input.shape[:-1]) + (1,)
    if input.numel() == 0:
        return torch.empty(shape, dtype=torch.float32), torch.empty(shape, dtype=torch.int32)
    x = _token_rows(input.to(torch.float32))
    min_neg = x.amin(dim=-1, keepdim=True).clamp(max=0.0)
    max_pos = x.amax(dim=-1, keepdim=True).clamp(min=0.0)
    scale = ((max_pos - min_neg) / 255.0).clamp(min=_FP32_EPS)
    descaled_min = min_neg / scale
    descaled_max = max_pos / scale
    zero_point = torch.where(
        (-128 + descaled_min) + (127 + descaled_max) > 0,
        -128 - descaled_min,
        127 - descaled_max,
    )
    zero_point = zero_point.clamp(-128, 127).round().to(torch.int32)
    return scale.reshape(shape), zero_point.reshape(shape)


def quantize_per_token_dynamic(input, dtype):
    """`choose_qparams_per_token_asymmetric`, then `quantize_per_token` with its parameters
    (int8, [-128, 127]): returns (q, scales, zero_points)."""
    scales, zero_points = choose_qparams_per_token_asymmetric(input, dtype)
    return quantize_per_token(input, scales, zero_points, -128, 127, dtype), scales, zero_points


def quantize_affine_per_token_dynamic(input, eps):
    """torchao's ``choose_qparams_affine`` (asymmetric, int8 [-128, 127], one block per token,
    `eps`, fp32 scales) then ``quantize_affine`` with those parameters, in torchao's order:
    the parameters in the input's dtype (fp32, or fp16 with every step rounded to fp16, as
    PyTorch's fp16 ops round; `eps` then an fp16 value), the zero point rounded before it is
    subtracted from -128, and x (as fp32) multiplied by the correctly rounded fp32 reciprocal
    of its scale. Returns (q, scales, zero_points): int8, fp32 and int32 (torchao's zero
    points are whole numbers in [-128, 127]), the last two of shape ``input.shape[:-1]``."""
    shape = tuple(input.shape[:-1])
    if input.numel() == 0:
        return (torch.empty(input.shape, dtype=torch.int8), torch.empty(shape, dtype=torch.float32),
                torch.empty(shape, dtype=torch.int32))
    x = _token_rows(input)
    min_neg = x.amin(dim=-1, keepdim=True).clamp(max=0.0)
    max_pos = x.amax(dim=-1, keepdim=True).clamp(min=0.0)
    scale = ((max_pos - min_neg) / 255.0).clamp(min=fp32(eps))
    zero_point = (-128 - torch.round(min_neg / scale)).clamp(-128, 127).to(torch.int32)
    scale = scale.to(torch.float32)
    q = quantize_per_token(input, scale, zero_point, -128, 127, torch.int8)
    return q, scale.reshape(shape), zero_point.reshape(shape)
