"""How cache_attention spreads its work over workgroups (runtime/families/attention.py), as
tables: decode at Llama shapes takes many chunks of whole tiles, many tokens and small caches
one chunk (one dispatch), and the chunks always cover the cache; from TILED_MIN_TOKENS tokens
a call takes the tiled kernel, its key tiles within the shared-memory budget, a row's lanes
dividing its head dim's units and the subgroup (one lane without shuffles). No Vulkan (the
kernels' results against PyTorch: tests/ops/test_attention.py)."""

from __future__ import annotations

import pytest

from runtime.families.attention import (
    CHUNK_GRAIN,
    TARGET_WORKGROUPS,
    TILE_BYTES,
    TILED_MIN_TOKENS,
    AttentionSplit,
    attention_split,
    attention_tile_keys,
    attention_tile_lanes,
)


@pytest.mark.parametrize(("items", "cache_len", "want"), [
    (8, 1280, AttentionSplit(64, 20)),       # Llama-3.2-1B decode: 8 kv heads
    (8, 4096, AttentionSplit(128, 32)),      # a longer cache: longer chunks, 256 workgroups
    (1, 131072, AttentionSplit(512, 256)),   # MQA, 128k positions
    (16, 1280, AttentionSplit(128, 10)),     # batch 2: 160 workgroups
    (8 * 128, 1280, AttentionSplit(78 * 64, 1)),  # 128 tokens (the tiled kernel's): one chunk
    (8, 64, AttentionSplit(64, 1)),          # one tile of keys: one chunk
    (8, 65, AttentionSplit(64, 2)),          # the second chunk holds one key
    (TARGET_WORKGROUPS, 64 * 7, AttentionSplit(64 * 7, 1)),
    (0, 1280, AttentionSplit(64, 20)),       # no tokens: nothing is dispatched
    (8, 0, AttentionSplit(64, 1)),
])
def test_rule(items, cache_len, want):
    assert attention_split(items, cache_len) == want


@pytest.mark.parametrize("items", [1, 3, 8, 32, 100, 264, 1000])
@pytest.mark.parametrize("cache_len", [1, 63, 64, 65, 1280, 4097, 32768])
def test_chunks_are_whole_grains_that_cover_the_cache_once(items, cache_len):
    split = attention_split(items, cache_len)
    assert split.chunk_keys % CHUNK_GRAIN == 0 and split.chunks >= 1
    assert (split.chunks - 1) * split.chunk_keys < cache_len <= split.chunks * split.chunk_keys
    # about TARGET_WORKGROUPS workgroups, never fewer than the pairs or one per grain of keys
    workgroups = items * split.chunks
    assert workgroups <= max(TARGET_WORKGROUPS, items) + items
    assert workgroups >= min(TARGET_WORKGROUPS // 2, items * -(-cache_len // CHUNK_GRAIN))


@pytest.mark.parametrize(("tokens", "head_dim", "want"), [
    (1, 64, 0),                      # decode: the split kernel
    (TILED_MIN_TOKENS - 1, 64, 0),
    (TILED_MIN_TOKENS, 64, 16),      # the threshold: tiled, 16 keys a tile
    (512, 64, 16),                   # Llama-3.2-1B's prefill
    (512, 80, 16),
    (512, 128, 16),
    (512, 192, 16),                  # 24 KiB: 16 key and value rows of 192 fp32 values
    (512, 384, 8),
    (512, 512, 6),
    (512, 3072, 1),
    (512, 3076, 0),                  # no key row fits: the split kernel
])
def test_tiled_rule(tokens, head_dim, want):
    assert attention_tile_keys(tokens, head_dim) == want


@pytest.mark.parametrize("head_dim", [4, 64, 80, 96, 128, 256, 1024])
def test_staged_tiles_fit_the_budget(head_dim):
    keys = attention_tile_keys(512, head_dim)
    assert keys >= 1 and 2 * keys * head_dim * 4 <= TILE_BYTES


@pytest.mark.parametrize(("head_dim", "subgroup", "shuffles", "want"), [
    (64, 32, True, 2),     # Llama-3.2-1B on the H100 and H200: 16 units, 2 lanes of 8
    (64, 32, False, 1),    # no subgroup shuffles: one invocation a row
    (80, 8, True, 2),      # 20 units
    (8, 32, True, 2),      # 2 units
    (24, 32, True, 2),     # 6 units
    (12, 32, True, 1),     # 3 units
    (4, 32, True, 1),
    (128, 2, True, 2),     # subgroups of 2 invocations
    (128, 1, True, 1),
])
def test_lanes_rule(head_dim, subgroup, shuffles, want):
    assert attention_tile_lanes(head_dim, subgroup, shuffles) == want
