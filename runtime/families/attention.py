"""How ``etvk.cache_attention`` splits the keys of a query over workgroups (docs/attention_ops.md).

`attention_split(items, cache_len)` chooses the chunk of keys one workgroup of
the ``cache_attention`` shader takes and how many chunks cover the cache. The
op is recorded once and replayed with other positions (the positions live in
a device buffer), so the split follows from the static sizes alone: the
``items = B * S * Hkv`` (token, kv head) pairs and the cache length L. The
rule spreads the whole cache's keys, ``items * L``, over about
`TARGET_WORKGROUPS` workgroups, in chunks of whole `CHUNK_GRAIN`s of keys
(at least one):

    chunk_keys = CHUNK_GRAIN * max(1, ceil(items * L / (TARGET_WORKGROUPS * CHUNK_GRAIN)))
    chunks = max(1, ceil(L / chunk_keys))

A decode step of Llama-3.2-1B (8 kv heads) over a 1280-position cache gets
20 chunks of 64 keys (160 workgroups); a prefill of 128 tokens gets one chunk
(1024 items already fill the GPU), and one chunk means one dispatch, no
combine. Chunks that start past a query's position find no key and exit; the
combine step reads only the chunks with keys.

Pure arithmetic; called by the op stub (through runtime/ops/stub_support.py),
the tests and benchmarks/llm_bench.py.
"""

from __future__ import annotations

from dataclasses import dataclass

# Keys of a chunk come in whole grains: one tile of the cache_attention shader (its workgroup
# size, op_specs/attention.yaml), so that only a chunk's last tile may be partly filled. The
# tests make it small to split small caches; the shader takes any chunk length.
CHUNK_GRAIN = 64
# Workgroups the whole cache's keys are spread over: two per SM of a 132-SM GPU (H100, H200),
# not yet measured (benchmarks/llm_bench.py times the rule next to other chunk lengths).
TARGET_WORKGROUPS = 264


@dataclass(frozen=True)
class AttentionSplit:
    """Keys per chunk (``chunk_keys``) and chunks per (token, kv head) (``chunks``)."""

    chunk_keys: int
    chunks: int


def attention_split(items: int, cache_len: int) -> AttentionSplit:
    """The split of `items` (token, kv head) pairs over a cache of `cache_len` keys, by the rule
    of the module docstring (`CHUNK_GRAIN` and `TARGET_WORKGROUPS` read at each call)."""
    grain = CHUNK_GRAIN
    grains = max(1, -(-items * cache_len // (TARGET_WORKGROUPS * grain)))
    chunk_keys = grain * grains
    return AttentionSplit(chunk_keys, max(1, -(-cache_len // chunk_keys)))
