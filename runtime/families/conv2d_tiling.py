"""How the pointwise int8 GEMM (shader ``q8ta_gemm``) tiles one problem.

The GEMM's M is output pixels, N output channel words (4 channels each) and
K input channel words. A workgroup of `GEMM_WORKGROUP` invocations (the
shader's workgroup in op_specs/conv2d.yaml) covers TILE_M pixels x TILE_N4
words per invocation, THREADS_N invocations along N per K slice, and splits K
into SPLIT_K slices of BLOCK_K-word chunks staged in shared memory. The rule
was tuned on an H100 (benchmarks/NOTES.md): one slice per workgroup when K is
short or there are enough workgroups, else K split over 2 to 16 slices; tiles
of 8 or more accumulator ivec4 per invocation ran about 5x slower there, so
every rule tiling is 4 pixels x 1 word. A tiling the tuner measured on the
device (runtime/families/conv2d_tuning.py) replaces the rule.
`prefers_coop_gemm` is the shape half of the choice of the cooperative-matrix
GEMM (``q8ta_gemm_coop``, 64 x 64 output tiles): one group, enough pixels (or,
for the implicit im2col, a long K; for the pointwise GEMM, many tiles and a long K), at
least half a tile of channels and a K long enough to pay. Pure arithmetic: no Vulkan. Called by the conv op specs through the
``gemm_tiling`` and ``conv2d_algorithm`` expression helpers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GEMM_WORKGROUP = 256  # must equal q8ta_gemm's workgroup in op_specs/conv2d.yaml
# Batch-1 pointwise convs leave the rule few workgroups (H200, session 29: `runtime tune` of
# MobileNetV2 and EfficientNet-B0 at batch 1, benchmarks/NOTES.md). Under GEMM_FEW_GROUPS
# one-slice workgroups the tuner split K over 16 slices of 4 threads along N from
# GEMM_FEW_DEEP_SPLIT_MIN_K4 K words on (1.12-1.48x the rule's speed at 96 to 288 K words and
# 1, 49 and 196 pixels) and over 8 slices of 8 threads from 32 (1.07-1.19x); under 192
# workgroups, K of 8 to 31 words went to 2 slices of 16 threads, or to 4 slices of 8 from 16
# words under 40 workgroups (1.04-1.32x at 196 and 784 pixels), where the rule kept one slice.
GEMM_FEW_GROUPS = 16
GEMM_FEW_DEEP_SPLIT_MIN_K4 = 96
GEMM_SHORT_K_SPLIT_MIN_K4 = 8
COOP_TILE = 64  # output pixels and channels of a q8ta_gemm_coop workgroup
COOP_MIN_PIXELS = 16 * COOP_TILE  # smaller GEMMs leave too few workgroups (a guess: tune)
# Fewer output channels leave most of a 64-channel tile empty. At 32 (half a tile) the coop GEMM
# still won on the H200 at batch 32 (session 28, benchmarks/NOTES.md): MobileNetV2's 1x1
# 192->32 at 28x28 pw_coop 8.2 us against pw 12.7; at 16 it lost (EfficientNet-B0's 1x1 96->16
# at 112x112: 68.5 against 65.2).
COOP_MIN_C_OUT = 32
# Shorter K (bytes) ran slower on the cooperative matrices than on the dot-product GEMM. H200,
# session 8's q8ta_gemm_coop (benchmarks/NOTES.md), coop time / dot-product time: K = 64 0.68
# and 0.78 at batch 32, 0.86 at batch 1; K = 32 0.93; K = 24 1.06 and 1.24; K = 16 1.17 and 0.98.
COOP_MIN_K = 64
# ... but the implicit im2col won at any pixel count from this K on. H200, batch 1, session 28
# (benchmarks/NOTES.md), im2col_coop (K splits by the rule) against the dot-product im2col:
# ResNet-50's 3x3 256 at 14x14 (196 pixels, K 2304) 12.1 against 17.2 us, 3x3 512 at 7x7 (49,
# 4608) 13.1 against 17.5, DenseNet-121's 3x3 128->32 (K 1152) at 28, 14 and 7: 0.71-0.74x.
# Session 29 (`runtime tune` of ResNet-50 at batch 1): its 1x1 stride-2 1024->2048 (49 pixels, K
# 1024) 10.1 against 14.0 us; at K 512 (512->1024, 196 pixels) the dot-product im2col stayed best.
COOP_IM2COL_SMALL_MAP_MIN_K = 1024
# ... and the pointwise coop GEMM won under COOP_MIN_PIXELS where its tiles are many and K
# long. H200, batch 1, session 29 (`runtime tune`, benchmarks/NOTES.md), pw_coop against the
# rule's pw: ResNet-50's 1x1 1024->512 at 14x14 (32 tiles) 8.8 against 12.2 us, 512->256 at 28x28
# (52) 7.4 against 9.9, 512->2048 at 7x7 (32) 7.0 against 8.4; with fewer tiles pw stayed best
# (1024->256 at 14x14, 16 tiles: pw 7.9 us; DenseNet-121's 1x1 ->128 at 14x14, 8 tiles).
COOP_PW_SMALL_MAP_MIN_TILES = 32
COOP_PW_SMALL_MAP_MIN_K = 512
# The coop GEMMs stage 128-byte K chunks up to this many 64 x 64 tiles, else 64-byte ones. H200,
# 128- against 64-byte chunks (benchmarks/NOTES.md): q8ta_gemm_coop_im2col (session 9) 0.90-0.97x
# the time at 100 and 196-200 tiles, 1.0 at 49, 1.12-1.49x at 392 tiles and more (occupancy wins
# there); q8ta_gemm_coop (session 10) 0.88-0.97x at 49-200 tiles, 1.01-1.68x at 392 and more
# (K <= 1024 bytes).
COOP_WIDE_CHUNK_MAX_TILES = 256
# ... and q8ta_gemm_coop from this many K bytes at any tile count: half the chunks' barriers pay
# for the residency there. H200, session 10: 0.88-0.95x the time at K = 2048 and 4096 (1024 and
# 4096 tiles), 1.01-1.22x at K = 512 and 1024 (392 to 2048 tiles). The implicit im2col's heavier
# staging lost at K = 2304 (392 tiles, 1.31x).
COOP_WIDE_CHUNK_MIN_K = 2048
COOP_CHUNK_KERNELS = ("pw", "im2col")
# K ranges of the coop GEMMs (K_SPLITS; a second dispatch adds their int32 sums). With few
# tiles a workgroup's chain of chunks sets the time and most SMs idle; a split costs ~9-13 us
# of its own on the H200 (inferred from the times: the ranges' fixed work, the partial sums, the
# second dispatch), so it pays only where the chain is long. H200, session 12 (benchmarks/NOTES.md), best against one
# range: b1 3x3 512 7 (8 tiles, 36 chunks) 8 ranges 0.44x the time, b1 3x3 256 14 (16 tiles,
# 18 chunks) 8 ranges 0.65x, b8 3x3 512 7 (56 tiles, 36 chunks) 4 ranges 0.68x, b1 1x1
# 2048->512 7 (8 tiles, 16 chunks) 8 ranges 0.70x; no split gained at 100 tiles or more, nor
# under 16 chunks but one (b1 3x3 128 28: 26 tiles, 9 chunks, 0.93x). The tuner measures 1, 2,
# 4 and 8 (conv2d_tuning.py).
COOP_SPLIT_MAX_TILES = 64
COOP_SPLIT_MIN_CHUNKS = 16
COOP_MAX_K_SPLITS = 8
COOP_SPLIT_MAX_WORKGROUPS = 256


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class GemmTiling:
    """The spec constants of one q8ta_gemm dispatch and its workgroup counts."""

    tile_m: int
    tile_n4: int
    threads_n: int
    split_k: int
    block_k: int
    m: int  # output pixels (rows padded to 4 widths when a layout is 4W4C)
    n4: int  # output channel words

    @property
    def groups(self) -> list[int]:
        """Workgroup counts [x, y, 1] covering M x N."""
        rows = GEMM_WORKGROUP // self.split_k // self.threads_n
        return [_ceil_div(self.m, self.tile_m * rows),
                _ceil_div(self.n4, self.tile_n4 * self.threads_n), 1]


def gemm_tiling(m: int, k4: int, c_out: int, settings: Mapping[str, int] | None = None) -> GemmTiling:
    """The tiling of a GEMM of `m` output pixels, `k4` K words and `c_out` output channels.

    `settings` (``tile_m tile_n4 threads_n split_k block_k``, a measured choice of
    runtime/families/conv2d_tuning.py) replaces the rule when given and not empty.
    """
    n4 = _ceil_div(c_out, 4)
    if settings:
        return GemmTiling(settings["tile_m"], settings["tile_n4"], settings["threads_n"],
                          settings["split_k"], settings["block_k"], m, n4)
    threads_n = 8 if n4 <= 8 else 16
    one_slice_groups = _ceil_div(m, 4 * GEMM_WORKGROUP // threads_n) * _ceil_div(n4, threads_n)
    few = one_slice_groups < GEMM_FEW_GROUPS
    if one_slice_groups >= 192:
        shape = (8, 1, 8) if k4 < 32 else (threads_n, 2 if k4 >= 512 else 1, 8)
    elif k4 < GEMM_SHORT_K_SPLIT_MIN_K4:
        shape = (8, 1, 8)
    elif k4 < 32:
        shape = (8, 4, 4) if k4 >= 16 and one_slice_groups < 40 else (threads_n, 2, 8)
    elif k4 >= 512 or (few and k4 >= GEMM_FEW_DEEP_SPLIT_MIN_K4):
        shape = (4, 16, 4)
    elif one_slice_groups >= 40:
        shape = (threads_n, 2, 8)
    elif k4 >= 128 or few:
        shape = (8, 8, 4)
    else:
        shape = (8, 4, 4)
    threads, split_k, block_k = shape
    return GemmTiling(4, 1, threads, split_k, block_k, m, n4)


def coop_chunk(kernel: str, m: int, k: int, c_out: int, settings: Mapping | None = None) -> str:
    """The K chunk (the CHUNK axis) of coop GEMM `kernel` ("pw": q8ta_gemm_coop, "im2col":
    q8ta_gemm_coop_im2col) for `m` output pixels, `k` K bytes and `c_out` channels: a measured
    ``chunk`` setting (64 or 128 bytes) when given, else the rule: "k128" where K is longer than
    one 64-byte chunk and either there are at most `COOP_WIDE_CHUNK_MAX_TILES` output tiles or,
    pointwise, K is at least `COOP_WIDE_CHUNK_MIN_K` bytes; else "k64"."""
    if kernel not in COOP_CHUNK_KERNELS:
        raise ValueError(f"coop_chunk: kernel must be one of {COOP_CHUNK_KERNELS}, got {kernel!r}")
    if settings and "chunk" in settings:
        return f"k{settings['chunk']}"
    tiles = _ceil_div(m, COOP_TILE) * _ceil_div(c_out, COOP_TILE)
    wide = tiles <= COOP_WIDE_CHUNK_MAX_TILES or (kernel == "pw" and k >= COOP_WIDE_CHUNK_MIN_K)
    return "k128" if k > 64 and wide else "k64"


def coop_a_load(layout: str, c_in: int) -> str:
    """The A_LOAD axis of the coop GEMMs: "w16" (the staging reads its input 16 bytes at a time)
    where the input is 4C and `c_in` % 16 == 0, so that each pixel's K words come in aligned
    runs of 4; else "w4" (4 bytes at a time)."""
    return "w16" if layout == "4C" and c_in % 16 == 0 else "w4"


def coop_k_splits(kernel: str, m: int, k: int, c_out: int, settings: Mapping | None = None) -> int:
    """K_SPLITS of coop GEMM `kernel` for `m` output pixels, `k` K bytes and `c_out` channels:
    a measured ``k_splits`` setting when given, else the rule: one range, except for at most
    `COOP_SPLIT_MAX_TILES` tiles and at least `COOP_SPLIT_MIN_CHUNKS` chunks, which take the
    most ranges (powers of two up to `COOP_MAX_K_SPLITS`) that keep 2 chunks per range and
    `COOP_SPLIT_MAX_WORKGROUPS` workgroups."""
    if settings and "k_splits" in settings:
        return settings["k_splits"]
    tiles = _ceil_div(m, COOP_TILE) * _ceil_div(c_out, COOP_TILE)
    chunks = _ceil_div(k, 128 if coop_chunk(kernel, m, k, c_out, settings) == "k128" else 64)
    splits = 1
    if tiles <= COOP_SPLIT_MAX_TILES and chunks >= COOP_SPLIT_MIN_CHUNKS:
        while (2 * splits <= COOP_MAX_K_SPLITS and 2 * splits * tiles <= COOP_SPLIT_MAX_WORKGROUPS
               and chunks >= 4 * splits):
            splits *= 2
    return splits


def prefers_coop_gemm(kernel: str, m: int, k: int, c_out: int, groups: int) -> bool:
    """Whether a GEMM of `m` output pixels, `k` bytes of K and `c_out` channels suits the coop
    GEMM `kernel` ("pw": ``q8ta_gemm_coop``, "im2col": ``q8ta_gemm_coop_im2col``)."""
    if kernel not in COOP_CHUNK_KERNELS:
        raise ValueError(f"prefers_coop_gemm: kernel must be one of {COOP_CHUNK_KERNELS}, got {kernel!r}")
    tiles = _ceil_div(m, COOP_TILE) * _ceil_div(c_out, COOP_TILE)
    small_map = (k >= COOP_IM2COL_SMALL_MAP_MIN_K if kernel == "im2col"
                 else tiles >= COOP_PW_SMALL_MAP_MIN_TILES and k >= COOP_PW_SMALL_MAP_MIN_K)
    enough_pixels = m >= COOP_MIN_PIXELS or small_map
    return groups == 1 and c_out >= COOP_MIN_C_OUT and enough_pixels and k >= COOP_MIN_K
