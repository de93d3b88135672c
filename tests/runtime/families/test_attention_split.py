"""How cache_attention splits the keys over workgroups (runtime/families/attention.py), as a
table: decode at Llama shapes takes many chunks of whole tiles, prefill and small caches one
chunk (one dispatch), and the chunks always cover the cache. No Vulkan (the split's results
against PyTorch: tests/ops/test_attention.py)."""

from __future__ import annotations

import pytest

from runtime.families.attention import (
    CHUNK_GRAIN,
    TARGET_WORKGROUPS,
    AttentionSplit,
    attention_split,
)


@pytest.mark.parametrize(("items", "cache_len", "want"), [
    (8, 1280, AttentionSplit(64, 20)),       # Llama-3.2-1B decode: 8 kv heads
    (8, 4096, AttentionSplit(128, 32)),      # a longer cache: longer chunks, 256 workgroups
    (1, 131072, AttentionSplit(512, 256)),   # MQA, 128k positions
    (16, 1280, AttentionSplit(128, 10)),     # batch 2: 160 workgroups
    (8 * 128, 1280, AttentionSplit(78 * 64, 1)),  # prefill of 128 tokens: one chunk
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
