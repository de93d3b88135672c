"""Reference numerics of the llm family: the floating-point ops of decoder LLMs.

Each function computes its op in the evaluation order docs/llm_ops.md defines
(fp16 inputs converted to fp32 exactly, every step one fp32 operation,
results rounded to the input's dtype where the page says so), which is the
order Hugging Face transformers' eager code and PyTorch's CPU kernels use:

- `embedding`, `rope`, `binary`, `scalar`, `cast` are bit-identical to PyTorch's
  eager expressions, and so are the shaders;
- `rms_norm` is Hugging Face's order, `layer_norm` PyTorch's, `act_mul` PyTorch's ``act(gate) * up``
  with the activation evaluated in float64; the shaders' reduction order and
  ``exp`` differ, so they are compared with the tolerances of `TOLERANCES`;
- `rms_norm_quantize` and `act_mul_quantize` are those two followed by
  `runtime.reference.quantize.quantize_affine_per_token_dynamic`, and
  `add_rms_norm_quantize` is `binary`'s add followed by `rms_norm_quantize` (their
  shaders are bit-exact against the device ops composed, not against this).

Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the arithmetic needs (the op stubs check arguments).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from runtime.families.llm import broadcast, scalar_operand
from runtime.reference.quantize import quantize_affine_per_token_dynamic

# How far a shader's output may be from the reference (docs/llm_ops.md, "Tolerances"):
# (op, dtype) -> (rtol, atol): |got - want| <= rtol * |want| + atol (act_mul:
# + atol * max(1, |up|)). Ops not listed are bit-exact.
TOLERANCES = {
    ("rms_norm", torch.float32): (2.0**-19, 0.0),
    ("layer_norm", torch.float32): (2.0**-18, 2.0**-18),
    ("layer_norm", torch.float16): (2.0**-9, 2.0**-14),
    ("rms_norm", torch.float16): (2.0**-9, 2.0**-23),
    ("act_mul", torch.float32): (2.0**-16, 2.0**-112),
    ("act_mul", torch.float16): (2.0**-9, 2.0**-23),
}


def tolerance(op: str, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of an op's outputs of ``dtype``; (0, 0) for the bit-exact ops."""
    return TOLERANCES.get((op, dtype), (0.0, 0.0))


def embedding(weight, indices):
    """``weight[indices]``: rows of ``weight`` [V, D], out ``[*indices.shape, D]``, copied bits."""
    return weight[indices.long()]


def rms_norm(x, weight, eps, weight_offset=0.0):
    """RMSNorm over the last dimension, Hugging Face's order.

    ``x32 = float32(x)``; ``var = mean(x32 * x32)``; ``y = (x32 * rsqrt(var + fp32(eps))).to(x.dtype)``;
    then ``out = (float32(y) * (float32(weight) + fp32(weight_offset))).to(x.dtype)``
    (no weight: ``out = y``). With ``weight_offset = 0`` this is Llama's
    ``weight * y.to(dtype)``; Gemma's ``y * (1 + weight)`` is ``weight_offset = 1``.
    """
    x32 = x.to(torch.float32)
    var = x32.pow(2).mean(-1, keepdim=True)
    eps32 = torch.tensor(eps, dtype=torch.float64).to(torch.float32)
    y = (x32 * torch.rsqrt(var + eps32)).to(x.dtype)
    if weight is None:
        return y
    offset = torch.tensor(weight_offset, dtype=torch.float64).to(torch.float32)
    w = weight.to(torch.float32) + offset
    return (y.to(torch.float32) * w).to(x.dtype)


def layer_norm(x, weight, bias, eps):
    """LayerNorm over the last dimension, PyTorch's: ``F.layer_norm`` of ``float32(x)`` with the
    fp32 weight and bias (None: 1 and 0) and ``fp32(eps)``, rounded to x's dtype (PyTorch's
    fp16 kernel computes in fp32 and rounds once, as this does)."""
    eps32 = float(torch.tensor(eps, dtype=torch.float64).to(torch.float32))
    w = None if weight is None else weight.to(torch.float32)
    b = None if bias is None else bias.to(torch.float32)
    return F.layer_norm(x.to(torch.float32), (x.shape[-1],), w, b, eps32).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, cos, sin):
    """``r * cos + rotate_half(r) * sin`` on ``r = x[..., :R]`` for x [B, S, H, D], cos and sin
    [B, S, R] or [S, R] (R even, at most D), the other ``D - R`` values of each head passed
    through: ``cat((rotated, x[..., R:]), -1)``, transformers' partial rotary (R = D: all rotated).

    Each product rounded to x's dtype, then the sum: PyTorch's eager order.
    """
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # one row for all heads
    rotary = cos.shape[-1]
    r = x[..., :rotary]
    return torch.cat((r * cos + _rotate_half(r) * sin, x[..., rotary:]), dim=-1)


# The activations in forms without cancellation, for float64 arguments: gelu_tanh's
# 0.5 x (1 + tanh(u)) is x * sigmoid(2u), gelu's 0.5 x (1 + erf(x / sqrt(2))) is
# 0.5 x erfc(-x / sqrt(2)), so that the tails keep their relative accuracy.
_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_tanh": lambda x: x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)),
    "gelu": lambda x: 0.5 * x * torch.special.erfc(-x / math.sqrt(2)),
}


def act_mul(gate, up, activation):
    """``act(gate) * up``: the activation in float64, rounded to fp32 and then to the dtype,
    then the product in fp32, rounded to the dtype.

    The shaders compute the activation in fp32 (within `TOLERANCES` of this). PyTorch's
    own GELUs lose the negative tail to cancellation in ``1 + erf(z)`` and ``1 + tanh(u)``
    (fp32 GELU at x = -5 is 17 % low), so float64 and the forms of `_ACTIVATIONS` define
    the activation here.
    """
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(_ACTIVATIONS)}")
    a = _ACTIVATIONS[activation](gate.to(torch.float64)).to(torch.float32).to(gate.dtype)
    return (a.to(torch.float32) * up.to(torch.float32)).to(gate.dtype)


_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


def binary(a, b, operation):
    """``a <operation> b`` with b broadcast to a's shape, one fp32 operation rounded to a's dtype."""
    if operation not in _BINARY:
        raise ValueError(f"operation {operation!r} is not one of {', '.join(_BINARY)}")
    if broadcast(a.shape, b.shape) is None:
        raise ValueError(f"b {tuple(b.shape)} does not broadcast to a's shape {tuple(a.shape)}")
    out = _BINARY[operation](a.to(torch.float32), b.to(torch.float32))
    return out.to(a.dtype)


def scalar(a, value, operation):
    """``a <operation> value`` for a Python float, with PyTorch's rounding of ``value``
    (`runtime.families.llm.scalar_operand`), one fp32 operation rounded to a's dtype."""
    if operation not in ("add", "mul"):
        raise ValueError(f"operation {operation!r} is not one of add, mul")
    operand = torch.tensor(scalar_operand(value, a.dtype, operation), dtype=torch.float32)
    out = a.to(torch.float32) + operand if operation == "add" else a.to(torch.float32) * operand
    return out.to(a.dtype)


def linear(x, weight, bias):
    """``x @ weight.T + bias`` for x [..., K], weight [N, K], bias [N] or None: computed in
    float64 (exact for fp16 inputs up to K = 2^20 or so, within 2^-52 relative of the
    magnitude sum for fp32) and rounded once to x's dtype. The shader's fp32 order differs;
    `linear_bound` is how far it may be from this."""
    out = x.to(torch.float64) @ weight.to(torch.float64).T
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out.to(x.dtype)


# linear's bound (docs/llm_ops.md, "linear"): per dtype, the relative and absolute terms
# around the fp32 sum's error.
LINEAR_ROUNDING = {torch.float32: (2.0**-23, 0.0), torch.float16: (2.0**-10, 2.0**-24)}


def linear_bound(x, weight, bias):
    """The largest ``|shader - linear(x, weight, bias)|`` docs/llm_ops.md allows, per output:
    ``(4 * ceil(K / 256) + 16) * 2^-24 * S + (K + 1) * 2^-125 + r * |want| + a``,
    S = sum_k |x_k * w_nk| + |b_n|, (r, a) of `LINEAR_ROUNDING`."""
    k = x.shape[-1]
    magnitude = x.to(torch.float64).abs() @ weight.to(torch.float64).abs().T
    if bias is not None:
        magnitude = magnitude + bias.to(torch.float64).abs()
    depth = 4 * -(-k // 256) + 16
    r, a = LINEAR_ROUNDING[x.dtype]
    want = linear(x, weight, bias).to(torch.float64)
    return depth * 2.0**-24 * magnitude + (k + 1) * 2.0**-125 + r * want.abs() + a


def rms_norm_quantize(x, weight, eps, weight_offset, quant_eps):
    """`rms_norm` then torchao's per-token int8 quantization of the result
    (`quantize_affine_per_token_dynamic` with ``quant_eps``): (q, scales, zero_points)."""
    return quantize_affine_per_token_dynamic(rms_norm(x, weight, eps, weight_offset), quant_eps)


def add_rms_norm_quantize(x, residual, weight, eps, weight_offset, quant_eps):
    """``sum = binary(x, residual, "add")``, then `rms_norm_quantize` of it:
    (sum, q, scales, zero_points)."""
    total = binary(x, residual, "add")
    return (total, *rms_norm_quantize(total, weight, eps, weight_offset, quant_eps))


def act_mul_quantize(gate, up, activation, quant_eps):
    """`act_mul` then torchao's per-token int8 quantization of the result
    (`quantize_affine_per_token_dynamic` with ``quant_eps``): (q, scales, zero_points)."""
    return quantize_affine_per_token_dynamic(act_mul(gate, up, activation), quant_eps)


def cast(x, dtype):
    """``x.to(dtype)``: fp16 -> fp32 exactly, fp32 -> fp16 rounded to nearest even."""
    return x.to(dtype)
