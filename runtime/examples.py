"""Example arguments for every op, built from a variant's axis values and a shape.

Shared by the tests (``tests/ops``), ``python -m runtime demo`` and the
benchmarks, so that all three exercise the same cases. The inputs are chosen
to hit the numerics that matter: rounding ties, saturation, narrow quant
ranges, per-token parameters, rows that are all positive, negative or zero.
Pure torch; no Vulkan.
"""

from __future__ import annotations

import math

import torch

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
}

# A narrower range than the dtype's, so clamping at quant_min/quant_max is
# exercised apart from the dtype's own limits.
NARROW = {"int8": (-100, 90), "uint8": (10, 240), "int32": (-50000, 70000)}
ZERO_POINT = {"int8": 3, "uint8": 128, "int32": -1000}


def fp_input(shape, dtype, gen, scale):
    """Normal values plus exact rounding ties and values far outside the range."""
    x = torch.randn(shape, generator=gen) * 40 * scale
    flat = x.view(-1)
    n = flat.numel()
    if n >= 8:
        k = torch.arange(n // 4, dtype=torch.float32)
        flat[: n // 4] = (k - n // 8 + 0.5) * scale  # ties: (k + 0.5) * scale
        flat[-1] = 1e30
        flat[-2] = -1e30
    return x.to(dtype)


def per_token_params(shape, gen, out):
    tokens = math.prod(shape[:-1])
    token_shape = tuple(shape[:-1]) + (1,)
    scales = (torch.rand(tokens, generator=gen) * 0.2 + 1e-3).reshape(token_shape)
    lo, hi = NARROW[out]
    zps = torch.randint(lo, hi + 1, (tokens,), generator=gen).reshape(token_shape)
    return scales, zps.to(torch.int32)


def int_input(shape, dtype, gen):
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**20)), min(info.max, 2**20)
    x = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64)
    return x.to(dtype)


def build_quantize_per_tensor(axes, shape, gen):
    out = axes["OUT_DTYPE"]
    scale = 0.0625 if shape and shape[-1] % 2 else 0.0371
    lo, hi = NARROW[out]
    x = fp_input(shape, DTYPES[axes["IN_DTYPE"]], gen, scale)
    return (x, scale, ZERO_POINT[out], lo, hi, DTYPES[out]), {}


def build_quantize_per_token(axes, shape, gen):
    out = axes["OUT_DTYPE"]
    scales, zps = per_token_params(shape, gen, out)
    lo, hi = NARROW[out]
    x = fp_input(shape, DTYPES[axes["IN_DTYPE"]], gen, 0.05)
    return (x, scales, zps, lo, hi, DTYPES[out]), {}


def build_dequantize_per_tensor(axes, shape, gen):
    q_dtype = DTYPES[axes["IN_DTYPE"]]
    info = torch.iinfo(q_dtype)
    q = int_input(shape, q_dtype, gen)
    zp = ZERO_POINT[axes["IN_DTYPE"]]
    return (q, 0.0371, zp, info.min, info.max, q_dtype), {"out_dtype": DTYPES[axes["OUT_DTYPE"]]}


def build_dequantize_per_token(axes, shape, gen):
    q_dtype = DTYPES[axes["IN_DTYPE"]]
    info = torch.iinfo(q_dtype)
    scales, zps = per_token_params(shape, gen, axes["IN_DTYPE"])
    q = int_input(shape, q_dtype, gen)
    return (q, scales, zps, info.min, info.max, q_dtype, DTYPES[axes["OUT_DTYPE"]]), {}


def build_choose_qparams(axes, shape, gen):
    x = torch.randn(shape, generator=gen) * 3
    rows = x.view(-1, shape[-1]) if x.numel() else x.view(0, 1)
    if rows.shape[0] >= 4:
        rows[0].abs_()  # all positive: min forced to 0
        rows[1] = -rows[1].abs()  # all negative: max forced to 0
        rows[2].zero_()  # all zero: scale = eps
        rows[3] += 50.0  # far from zero: zero point clamps
    return (x.to(DTYPES[axes["IN_DTYPE"]]), torch.int8), {}


EXAMPLES = {
    "etvk.quantize_per_tensor.default": build_quantize_per_tensor,
    "etvk.quantize_per_token.default": build_quantize_per_token,
    "etvk.dequantize_per_tensor.default": build_dequantize_per_tensor,
    "etvk.dequantize_per_token.default": build_dequantize_per_token,
    "etvk.choose_qparams_per_token_asymmetric.default": build_choose_qparams,
}
