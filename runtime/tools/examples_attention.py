"""Example cases of the attention family (attention over a static KV cache, the cache writes).

Each case is a shape and the cache positions of its tokens: decode (one token
anywhere in the cache, the first and the last position), prefill from 0 and
chunked prefill at positions with gaps, batches of 2, grouped-query (Hq / Hkv
of 1, 2, 3, 4), more keys than one tile of the shader (64) with queries on both
sides of a tile boundary, caches the op splits into chunks of keys
(runtime/families/attention.py: 64 keys here) with queries in the first, the
second and a partly filled third chunk, a head dim over the workgroup (more
than 64 units of 4), scores far beyond fp32's exp range (a softmax without the
max subtracted overflows), int32 and int64 positions, no tokens at all. Cache
rows past the largest position are NaN in the inputs (`attention_inputs`), so
reading one shows; `sdpa_caches` gives the same caches with finite values there,
for PyTorch's masked attention. The fused rope and cache write's cases add
partial rotary (R < D, units that straddle the rotated half or the tail) and cos
rows per batch, broadcast or shared. Used by the tests (tests/ops/test_attention.py)
and, through runtime/tools/examples.py, the demo. Pure torch; no Vulkan.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True)
class AttentionCase:
    """q [batch, len(positions), heads, head_dim] over caches [batch, kv_heads, cache_len, head_dim]."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    cache_len: int
    head_dim: int
    positions: tuple[int, ...]
    positions_dtype: torch.dtype = torch.int64
    amplitude: float = 1.0  # of q and k: scores grow with its square
    scale: float | None = None  # None: 1 / sqrt(head_dim)
    window: int = 0  # a sliding window of keys (0: none)

    @property
    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.scale is None else self.scale


@dataclass(frozen=True)
class UpdateCase:
    """value [batch, len(positions), kv_heads, head_dim] into cache [batch, kv_heads, cache_len, head_dim]."""

    name: str
    batch: int
    kv_heads: int
    cache_len: int
    head_dim: int
    positions: tuple[int, ...]
    positions_dtype: torch.dtype = torch.int64


ATTENTION_CASES = [
    AttentionCase("decode_gqa4_two_tiles", 1, 8, 2, 96, 64, (70,)),
    AttentionCase("decode_first_position_mha", 1, 4, 4, 16, 8, (0,)),
    AttentionCase("decode_mha_three_chunks", 1, 4, 4, 160, 8, (150,)),
    AttentionCase("decode_last_position_int32", 1, 6, 2, 33, 16, (32,), torch.int32),
    AttentionCase("prefill_from_zero_gqa3", 1, 6, 2, 40, 16, tuple(range(8))),
    AttentionCase("chunked_prefill_gaps_mqa_batch2", 2, 4, 1, 150, 12, (3, 63, 64, 130)),
    AttentionCase("head_dim_over_workgroup", 1, 2, 1, 20, 272, (5, 19), torch.int32),
    AttentionCase("large_scores", 1, 4, 2, 80, 32, (40, 79), amplitude=6.0),
    AttentionCase("explicit_negative_scale", 2, 4, 2, 12, 4, (2, 11), scale=-0.3),
    AttentionCase("no_query_tokens", 1, 4, 2, 8, 8, ()),
    # sliding windows: the keys p - W + 1 .. p of a query at p
    AttentionCase("decode_window_in_one_later_chunk", 1, 8, 2, 96, 64, (70,), window=5),
    AttentionCase("decode_window_over_three_chunks", 1, 4, 4, 160, 8, (150,), window=90),
    AttentionCase("decode_window_wider_than_the_position", 1, 4, 2, 24, 8, (10,), window=50),
    AttentionCase("prefill_window_gqa3", 1, 6, 2, 40, 16, tuple(range(20)), window=6),
    AttentionCase("chunked_prefill_window_gaps_batch2", 2, 4, 1, 150, 12, (3, 63, 64, 130), window=40),
    AttentionCase("window_of_one_key", 1, 4, 2, 20, 8, (0, 7, 19), torch.int32, window=1),
]
UPDATE_CASES = [
    UpdateCase("decode_one_token", 1, 2, 32, 8, (17,)),
    UpdateCase("prefill_from_zero", 1, 2, 16, 16, tuple(range(6))),
    UpdateCase("batch2_unordered_int32", 2, 3, 20, 4, (19, 0, 7), torch.int32),
    UpdateCase("head_dim_128", 1, 1, 9, 128, (8, 2)),
    UpdateCase("no_tokens", 1, 2, 8, 8, ()),
]


@dataclass(frozen=True)
class RopeUpdateCase:
    """q [batch, S, heads, head_dim], k_new and v_new [batch, S, kv_heads, head_dim] (S =
    len(positions)) into caches [batch, kv_heads, cache_len, head_dim]; cos and sin hold
    `rotary` values a row, [batch, S, R] (`cos_rows` "batch"), [1, S, R] ("one") or [S, R]
    ("shared")."""

    name: str
    batch: int
    heads: int
    kv_heads: int
    cache_len: int
    head_dim: int
    rotary: int
    positions: tuple[int, ...]
    cos_rows: str = "one"
    positions_dtype: torch.dtype = torch.int64


ROPE_UPDATE_CASES = [
    RopeUpdateCase("decode_gqa4_d64", 1, 8, 2, 32, 64, 64, (17,)),
    RopeUpdateCase("prefill_gqa3_partial_half", 1, 6, 2, 16, 32, 16, tuple(range(6))),
    RopeUpdateCase("batch2_unordered_int32_shared_rows", 2, 4, 2, 20, 16, 16, (19, 0, 7), "shared",
                   torch.int32),
    RopeUpdateCase("batch2_own_rows_mha", 2, 3, 3, 12, 8, 8, (3, 4), "batch"),
    RopeUpdateCase("partial_d80_r20_halves_straddle_units", 1, 4, 2, 10, 80, 20, (8, 2)),
    RopeUpdateCase("partial_d12_r6_batch2_mqa", 2, 2, 1, 8, 12, 6, (1, 5), "batch"),
    RopeUpdateCase("decode_d128_last_position", 1, 4, 1, 9, 128, 128, (8,)),
    RopeUpdateCase("no_tokens", 1, 4, 2, 8, 8, 8, ()),
]
ATTENTION_BY_NAME = {c.name: c for c in ATTENTION_CASES}
UPDATE_BY_NAME = {c.name: c for c in UPDATE_CASES}
ROPE_UPDATE_BY_NAME = {c.name: c for c in ROPE_UPDATE_CASES}


def _generator(name: str, seed: int | None) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) if seed is None else seed)


def _positions(case) -> torch.Tensor:
    return torch.tensor(case.positions, dtype=case.positions_dtype)


def sdpa_caches(case: AttentionCase, dtype: torch.dtype, seed: int | None = None):
    """(k_cache, v_cache) with every row finite: what `attention_inputs` holds, with
    random values instead of NaN in the rows past the largest position."""
    gen = _generator(case.name, seed)
    shape = (case.batch, case.kv_heads, case.cache_len, case.head_dim)
    k = (torch.randn(shape, generator=gen) * case.amplitude).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k, v


def attention_inputs(case: AttentionCase, dtype: torch.dtype, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.cache_attention`` for ``case`` in ``dtype``, in schema order; the
    cache rows past the largest position and, with a window, before every query's window
    (never to be read) are NaN."""
    k, v = sdpa_caches(case, dtype, seed)
    gen = _generator(case.name + " q", None if seed is None else seed + 1)
    shape = (case.batch, len(case.positions), case.heads, case.head_dim)
    q = (torch.randn(shape, generator=gen) * case.amplitude).to(dtype)
    filled = max(case.positions, default=-1) + 1
    unseen = min((max(0, p - case.window + 1) for p in case.positions), default=0) if case.window else 0
    k, v = k.clone(), v.clone()
    for rows in (slice(filled, None), slice(0, unseen)):
        k[:, :, rows] = math.nan
        v[:, :, rows] = math.nan
    return q, k, v, _positions(case), case.attention_scale, case.window


def special_values(count: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """`count` values of `dtype`: random normals, then bit patterns a conversion through
    fp32 could change (NaNs with payloads, subnormals, -0.0, infinities)."""
    values = torch.randn(count, generator=gen).to(dtype)
    bits = {torch.float32: torch.int32, torch.float16: torch.int16}[dtype]
    special = {
        torch.float32: [0x7FC00001, 0x7F800123, -0x00400001, 0x00000001, 0x007FFFFF,
                        -0x80000000, 0x7F800000, -0x00800000],
        torch.float16: [0x7E01, 0x7C03, -0x01FF, 0x0001, 0x03FF, -0x8000, 0x7C00, -0x0400],
    }[dtype]
    n = min(count, len(special))
    values.view(bits)[:n] = torch.tensor(special[:n], dtype=bits)
    return values


def update_inputs(case: UpdateCase, dtype: torch.dtype, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.cache_update`` for ``case`` in ``dtype``, in schema order; both
    tensors start with bit patterns that must survive the copy."""
    gen = _generator(case.name, seed)
    cache_shape = (case.batch, case.kv_heads, case.cache_len, case.head_dim)
    value_shape = (case.batch, len(case.positions), case.kv_heads, case.head_dim)
    cache = special_values(math.prod(cache_shape), dtype, gen).reshape(cache_shape)
    value = special_values(math.prod(value_shape), dtype, gen).reshape(value_shape)
    return cache, _positions(case), value


def rope_update_inputs(case: RopeUpdateCase, dtype: torch.dtype, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.rope_cache_update`` for ``case`` in ``dtype``, in schema order: q and
    k_new random (what the rotation reads), v_new and both caches starting with bit patterns
    that must survive the copy, cos and sin of random angles."""
    gen = _generator(case.name, seed)
    tokens = len(case.positions)
    q = (torch.randn(case.batch, tokens, case.heads, case.head_dim, generator=gen) * 2).to(dtype)
    k = (torch.randn(case.batch, tokens, case.kv_heads, case.head_dim, generator=gen) * 2).to(dtype)
    v = special_values(k.numel(), dtype, gen).reshape(k.shape)
    cache_shape = (case.batch, case.kv_heads, case.cache_len, case.head_dim)
    k_cache, v_cache = (special_values(math.prod(cache_shape), dtype, gen).reshape(cache_shape)
                        for _ in range(2))
    rows = {"batch": (case.batch, tokens), "one": (1, tokens), "shared": (tokens,)}[case.cos_rows]
    angles = torch.rand(*rows, case.rotary, generator=gen) * 6.3
    return q, k, v, angles.cos().to(dtype), angles.sin().to(dtype), k_cache, v_cache, _positions(case)


def build(op_name: str):
    """A builder for ``runtime.tools.examples.EXAMPLES``: the case of the op's table at
    index (the shape's last size mod the table's length), in the variant's DTYPE. For a
    variant with an EXCHANGE axis (the tiled kernel's), the first case from there that the
    variant serves: a head dim of an odd number of 4-value units for "none" (one invocation a
    row under any lanes rule: the lanes divide the units), an even number for "shuffle"."""
    cases, make = {
        "etvk.cache_attention.default": (ATTENTION_CASES, attention_inputs),
        "etvk.cache_update.default": (UPDATE_CASES, update_inputs),
        "etvk.rope_cache_update.default": (ROPE_UPDATE_CASES, rope_update_inputs),
    }[op_name]

    def builder(axes, shape, gen):
        start = shape[-1] if shape else 0
        order = [cases[(start + i) % len(cases)] for i in range(len(cases))]
        if "EXCHANGE" in axes:
            even = axes["EXCHANGE"] == "shuffle"
            order = [c for c in order if (c.head_dim // 4 % 2 == 0) == even]
        case = order[0]
        seed = int(torch.randint(0, 2**31, (), generator=gen))
        return make(case, DTYPES[axes["DTYPE"]], seed), {}

    return builder
