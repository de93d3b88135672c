"""Reference numerics of the attention family: attention over a static KV cache, the cache write.

``cache_attention`` evaluates causal grouped-query attention in fp32 in the
textbook order (all scores of a query row, one max-subtracted softmax, one
weighted sum), which the shader's online softmax reorders; both must lie
within `attention_tolerance` of the exact result (docs/attention_ops.md), which
`exact_attention` gives: PyTorch's ``scaled_dot_product_attention`` in float64
with the kv heads repeated and the boolean causal mask over the whole cache.
``cache_update`` is ``index_copy`` along the cache's sequence dimension (what
transformers' StaticCache does), bit-exact; ``rope_cache_update`` is the rope
of q and k and both cache writes of a layer, composed of the two.

Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the arithmetic needs (the op stubs check arguments).
"""

from __future__ import annotations

import math

import torch

from runtime.reference.llm import rope
from runtime.reference.quantize import fp32

# Bounds of docs/attention_ops.md ("Tolerances").
FP32_ERROR = 2.0**-22  # per unit of (1 + largest |score| + log2 of the keys read), times max |v|
FP16_ROUNDING = 2.0**-11  # half an fp16 ulp of max |v|: the rounding of an fp16 output


def _repeat_kv(cache: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, L, D] -> [B, Hkv * group, L, D]: query head h reads kv head h // group."""
    return cache.repeat_interleave(group, dim=1)


def _visible(positions: torch.Tensor, keys: int, window: int = 0, first: int = 0) -> torch.Tensor:
    """mask[i, j] = j <= positions[i], and with a window W > 0 also j > positions[i] - W, as a
    [S, keys - first] boolean tensor of the keys first .. keys - 1."""
    j, p = torch.arange(first, keys)[None, :], positions.to(torch.int64)[:, None]
    return (j <= p) & (j > p - window) if window else j <= p


def _key_range(positions: torch.Tensor, window: int) -> tuple[int, int]:
    """(first, end): the keys some query sees lie in [first, end): from the earliest window's
    first key (0 without a window) to the largest position."""
    end = int(positions.max()) + 1
    return (max(0, int(positions.min()) - window + 1) if window else 0), end


def cache_attention(q, k_cache, v_cache, positions, scale, window=0):
    """Causal grouped-query attention of q [B, S, Hq, D] over the caches [B, Hkv, L, D].

    Only keys 0 .. max(positions) are read, and with a window W > 0 a query at position p takes
    the keys p - W + 1 .. p alone (none before the earliest window is read). Scores ``(q . k) * fp32(scale)`` in
    fp32, a max-subtracted softmax in fp32, the weighted sum of the value rows
    in fp32, rounded once to q's dtype.

    Returns:
        ``[B, S, Hq, D]`` of q's dtype.
    """
    batch, tokens, heads, dim = q.shape
    if q.numel() == 0:
        return torch.empty(q.shape, dtype=q.dtype)
    first, keys = _key_range(positions, window)
    group = heads // k_cache.shape[1]
    k = _repeat_kv(k_cache[:, :, first:keys].float(), group)  # [B, Hq, keys - first, D]
    v = _repeat_kv(v_cache[:, :, first:keys].float(), group)
    scores = torch.matmul(q.float().transpose(1, 2), k.transpose(2, 3)) * fp32(scale)
    scores = scores.masked_fill(~_visible(positions, keys, window, first), -math.inf)
    out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [B, Hq, S, D]
    return out.transpose(1, 2).to(q.dtype).contiguous()


def exact_attention(q, k_cache, v_cache, positions, scale, window=0):
    """The result `cache_attention` approximates: ``scaled_dot_product_attention`` in
    float64 over the whole cache, kv heads repeated, ``mask[i, j] = j <= positions[i]`` (and
    ``j > positions[i] - window`` with a window).

    Returns:
        float64 ``[B, S, Hq, D]``.
    """
    group = q.shape[2] // k_cache.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q.double().transpose(1, 2), _repeat_kv(k_cache.double(), group),
        _repeat_kv(v_cache.double(), group), attn_mask=_visible(positions, k_cache.shape[2], window),
        scale=scale)
    return out.transpose(1, 2)


def attention_tolerance(q, k_cache, v_cache, positions, scale, window=0) -> float:
    """How far an fp32 evaluation of `cache_attention`, rounded to q's dtype, may be from
    `exact_attention` (docs/attention_ops.md, "Tolerances").

    ``max|v| * (2^-22 * (1 + R + log2(keys)) + h)``: R is the largest ``|scale| * sum_d
    |q_d k_d|`` over the visible pairs (what bounds a score and its rounding errors),
    ``keys`` the most keys a query sees, ``h`` = 2^-11 for fp16 (the output's rounding), 0
    for fp32. ``max|v|`` bounds ``|out|``: each output is a convex combination of value rows.
    """
    if q.numel() == 0:
        return 0.0
    first, keys = _key_range(positions, window)
    group = q.shape[2] // k_cache.shape[1]
    k = _repeat_kv(k_cache[:, :, first:keys].double().abs(), group)
    magnitudes = torch.matmul(q.double().abs().transpose(1, 2), k.transpose(2, 3)) * abs(scale)
    largest_score = float(magnitudes.masked_fill(~_visible(positions, keys, window, first), 0.0).max())
    largest_value = float(v_cache[:, :, first:keys].double().abs().max())
    rounding = FP16_ROUNDING if q.dtype == torch.float16 else 0.0
    return largest_value * (FP32_ERROR * (1.0 + largest_score + math.log2(keys)) + rounding)


def cache_update(cache, positions, value):
    """A copy of ``cache`` [B, Hkv, L, D] with ``cache[b, h, positions[s]] = value[b, s, h]``
    for value [B, S, Hkv, D]: ``index_copy`` along L, bit for bit.

    Returns:
        The updated copy, cache's shape and dtype.
    """
    return cache.index_copy(2, positions.to(torch.int64), value.transpose(1, 2))


def rope_cache_update(q, k_new, v_new, cos, sin, k_cache, v_cache, positions):
    """``(rope(q, cos, sin), cache_update(k_cache, positions, rope(k_new, cos, sin)),
    cache_update(v_cache, positions, v_new))``: the three ops it fuses, bit for bit.

    Returns:
        (q rotated, the updated k cache, the updated v cache): copies.
    """
    return (rope(q, cos, sin), cache_update(k_cache, positions, rope(k_new, cos, sin)),
            cache_update(v_cache, positions, v_new))
