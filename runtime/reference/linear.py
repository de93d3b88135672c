"""Reference numerics of ``etvk.linear_qta8a_qga4w`` (OPS.md family 3).

int8 per-token activations times 4-bit grouped weights::

    isum[m, n, g] = Σ_{k in group g} (x[m, k] - input_zero_point[m]) * (w[n, k] - weight_zeros[n, g])
    out[m, n]     = input_scale[m] * Σ_g weight_scales[n, g] * isum[m, n, g]

Evaluation order (what a shader must reproduce to agree within a tight
relative tolerance):

1. ``isum`` is an exact integer (computed in int64 here; it fits int32 for any
   group size up to 2**31 / (255 * 15) ≈ 561,000).
2. ``isum`` converts to fp32: exact while ``|isum| < 2**24``, which holds for
   group sizes up to 4386; beyond that it rounds to nearest.
3. ``acc = 0``; for ``g = 0, 1, ..., G-1`` in order:
   ``acc = acc + weight_scales[n, g] * float(isum[m, n, g])``, each product and
   each sum rounded to fp32 (a shader may fuse them into an fma).
4. ``out = input_scale[m] * acc``, rounded to fp32.

`linear_qta8a_qga4w_fp64` computes the same formula in float64 (every
product is exact there), as the tests' near-exact oracle. Called by the op
registry (as the ``torch.ops.etvk`` CPU kernel) and by the tests; it must not
touch Vulkan.
"""

from __future__ import annotations

import math

import torch

from runtime.errors import ArgumentError, ArgumentTypeError
from runtime.families.int4 import unpack_int4

OP = "etvk.linear_qta8a_qga4w.default"

# Tokens per chunk are chosen so one chunk's int64 group sums stay near this many values.
_CHUNK_VALUES = 1 << 22


def linear_qta8a_qga4w(x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros):
    """fp32 ``[..., N]`` output of the quantized linear, in the order of the module docstring.

    Args:
        x: int8 ``[..., K]``, quantized per token.
        input_scale: fp32, one per token (shape ``[..., 1]`` or ``[tokens]``).
        input_zero_point: int32, one per token, same shape rule.
        weight: uint8 ``[N, K/2]`` packed by `runtime.families.int4.pack_int4`.
        group_size: weights per group along K; divides K and is a multiple of 8.
        weight_scales: fp32 ``[N, K/group_size]``.
        weight_zeros: int32 ``[N, K/group_size]``, values in [-8, 7].

    Returns:
        fp32 tensor of shape ``x.shape[:-1] + (N,)``.

    Raises:
        ArgumentTypeError: an argument of the wrong type or dtype.
        ArgumentError: shapes that do not fit together, a bad group size, or
            weight zeros outside [-8, 7].
    """
    return _evaluate(
        torch.float32, x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros
    )


def linear_qta8a_qga4w_fp64(x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros):
    """The same formula as `linear_qta8a_qga4w` evaluated in float64 (a test oracle).

    The integer sums are exact and so is each product ``weight_scales * isum``
    (24 + 24 bits); only the sum over groups and the final scaling round, at
    float64 precision. Arguments, checks and shape are those of
    `linear_qta8a_qga4w`; the result is float64.
    """
    return _evaluate(
        torch.float64, x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros
    )


def _evaluate(dtype, x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros):
    """Checks the arguments, then evaluates token chunks in ``dtype`` (fp32 or fp64)."""
    _check_args(x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros)
    n, k, tokens = weight.shape[0], x.shape[-1], math.prod(x.shape[:-1])
    groups = k // group_size
    xs = x.reshape(tokens, k).to(torch.int64) - input_zero_point.reshape(tokens, 1).to(torch.int64)
    w = unpack_int4(weight).to(torch.int64).reshape(n, groups, group_size)
    ws = w - weight_zeros.to(torch.int64).reshape(n, groups, 1)
    s_in = input_scale.reshape(tokens, 1).to(dtype)
    s_w = weight_scales.to(dtype)
    out = torch.zeros(tokens, n, dtype=dtype)
    chunk = max(1, _CHUNK_VALUES // max(1, n * groups))
    for start in range(0, tokens, chunk):
        rows = xs[start : start + chunk]
        rows = rows.reshape(rows.shape[0], groups, group_size)
        isum = torch.einsum("mgk,ngk->mng", rows, ws)
        acc = torch.zeros(rows.shape[0], n, dtype=dtype)
        for g in range(groups):
            acc = acc + s_w[:, g] * isum[:, :, g].to(dtype)
        out[start : start + chunk] = s_in[start : start + chunk] * acc
    return out.reshape(*x.shape[:-1], n)


def _check_args(x, input_scale, input_zero_point, weight, group_size, weight_scales, weight_zeros):
    """Raises `ArgumentTypeError` / `ArgumentError` unless the arguments fit OPS.md family 3."""
    for arg, t, dtype in (
        ("x", x, torch.int8),
        ("input_scale", input_scale, torch.float32),
        ("input_zero_point", input_zero_point, torch.int32),
        ("weight", weight, torch.uint8),
        ("weight_scales", weight_scales, torch.float32),
        ("weight_zeros", weight_zeros, torch.int32),
    ):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(OP, arg, f"expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise ArgumentTypeError(OP, arg, f"expected dtype {dtype}, got {t.dtype}")
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ArgumentTypeError(OP, "group_size", f"expected an int, got {type(group_size).__name__}")
    if x.dim() < 1:
        raise ArgumentError(OP, "x", "expected a tensor [..., K] with at least one dimension, got a 0-d tensor")
    k = x.shape[-1]
    if weight.dim() != 2 or 2 * weight.shape[1] != k:
        raise ArgumentError(OP, "weight", f"expected packed uint8 [N, K/2] = [N, {k / 2:g}], got {tuple(weight.shape)}")
    if group_size <= 0 or group_size % 8 or k % group_size:
        raise ArgumentError(
            OP, "group_size", f"must be a positive multiple of 8 that divides K={k}, got {group_size}"
        )
    expected = (weight.shape[0], k // group_size)
    for arg, t in (("weight_scales", weight_scales), ("weight_zeros", weight_zeros)):
        if tuple(t.shape) != expected:
            raise ArgumentError(OP, arg, f"expected shape [N, K/group_size] = {list(expected)}, got {tuple(t.shape)}")
    if weight_zeros.numel() and (weight_zeros.min() < -8 or weight_zeros.max() > 7):
        raise ArgumentError(OP, "weight_zeros", "values must lie in [-8, 7]")
    tokens = math.prod(x.shape[:-1])
    shapes = {tuple(x.shape[:-1]) + (1,), (tokens,)}
    for arg, t in (("input_scale", input_scale), ("input_zero_point", input_zero_point)):
        if tuple(t.shape) not in shapes:
            raise ArgumentError(
                OP, arg, f"expected one value per token, shape {list(x.shape[:-1]) + [1]} or [{tokens}], "
                f"got {tuple(t.shape)}"
            )
