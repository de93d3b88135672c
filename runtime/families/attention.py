"""How ``etvk.cache_attention`` spreads its work over workgroups (docs/attention_ops.md).

`attention_tile_keys(tokens, head_dim)` picks the kernel: a call of at least
`TILED_MIN_TOKENS` query tokens (a prefill) takes the ``cache_attention_tiled``
shader, which shares each tile of keys among the (token, query head) rows of a
workgroup, with

    tile_keys = min(TILE_KEYS, TILE_BYTES // (8 * head_dim))

keys per tile (a key row and a value row of fp32 each, so the two staged
tiles stay within `TILE_BYTES` of shared memory: 16 keys up to D = 192); 0,
the split kernel below, for fewer tokens or a head dim over ``TILE_BYTES / 8``. Decode steps keep the
split kernel. `attention_tile_lanes(head_dim, subgroup_size, shuffles)` gives
the invocations (lanes) that serve one query row of the tiled kernel: the
largest of `TILE_LANES`, its half, ... that divides the head dim's units
(D / 4) and the device's smallest subgroup size, where the device has
subgroup shuffles; 1 (one invocation a row) otherwise. A workgroup of 64
invocations then holds 64 / lanes rows.

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
20 chunks of 64 keys (160 workgroups); a call of 32 tokens gets one chunk
(256 items already fill the GPU), and one chunk means one dispatch, no
combine. Chunks that start past a query's position find no key and exit; the
combine step reads only the chunks with keys.

The rules read the static sizes only (the lanes also the device's subgroups,
which stub_support.attention_lanes passes), and their constants at each call.
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
# Query tokens from which a call takes the tiled kernel. H200, session 29 (.devkit probe of
# llm_bench's prefill rows: Llama-3.2-1B's layer, positions 0..S-1, µs fp32, the rule's 2
# lanes a row against the split kernel): S = 32 11.8 / 12.5, 64 17.4 / 17.2, 128 27.8 / 33.5,
# 256 49.9 / 84.5, 512 111.6 / 246.6 (fp16 alike: 12.0 / 12.1, 17.3 / 17.0, 27.2 / 33.5, 48.3
# / 86.4, 106.8 / 252.7). The two tie at 64 tokens; from 128 the tiled kernel wins.
TILED_MIN_TOKENS = 128
# Keys per tile of the tiled kernel, and the shared memory its two staged tiles may take:
# with the shader's other 256 bytes within 32 KiB (lavapipe's limit; the H100's and H200's
# is 48 KiB). H200, session 29, 2 lanes a row, µs fp32 at S = 128 / 256 / 512: 8 keys a tile
# 28.3 / 49.8 / 112.0, 16 keys 25.8 / 44.1 / 96.7 (fp16 alike). With one lane a row (session
# 28, S = 512) 8 keys had won: 168.5 against 204.6 with 16 and 234.2 with 32.
TILE_KEYS = 16
TILE_BYTES = 24576
# Invocations a query row of the tiled kernel takes (a power of 2, at most 8: each holds
# D / 4 / lanes units of the row's q and accumulators, and the row's scores are their partial
# dot products added by subgroup shuffles), in workgroups of 64 invocations (64 / lanes rows).
# Same H200 run, µs at S = 128 / 512, fp32: one lane a row (the kernel before the lanes) 48.1 /
# 168.5, 2 lanes 27.8 / 111.6, 4 lanes 36.5 / 169.2, 8 lanes 36.0 / 172.8; 4 lanes in
# workgroups of 128 and 256 invocations (32 and 64 rows: less key staging, fewer workgroups)
# 38.1 / 171.0 and 46.3 / 194.9.
TILE_LANES = 2


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


def attention_tile_keys(tokens: int, head_dim: int) -> int:
    """Keys per tile of the tiled kernel for a call of `tokens` query tokens of head dim
    `head_dim`, 0 where the call takes the split kernel (the rule of the module docstring;
    `TILED_MIN_TOKENS`, `TILE_KEYS` and `TILE_BYTES` read at each call)."""
    if tokens < TILED_MIN_TOKENS:
        return 0
    return min(TILE_KEYS, TILE_BYTES // (8 * head_dim))


def attention_tile_lanes(head_dim: int, subgroup_size: int, shuffles: bool) -> int:
    """Invocations per query row of the tiled kernel at head dim `head_dim` on a device whose
    smallest subgroup has `subgroup_size` invocations and which has subgroup shuffles (or not):
    the rule of the module docstring (`TILE_LANES` read at each call)."""
    lanes = TILE_LANES if shuffles else 1
    while lanes > 1 and ((head_dim // 4) % lanes or subgroup_size % lanes):
        lanes //= 2
    return lanes
