"""What the int8 conv tuner may choose between, and what a measured choice is.

A `Conv2dChoice` is one way to run a conv: an algorithm op (pw, dw, im2col,
general), the packed input layout it reads, and the spec constants it runs
with (the GEMM tiling of pw and im2col, OUT_W of general and dw; empty
settings mean the op's own rule). `candidate_algorithms` lists the
algorithms valid for a geometry, `candidate_settings` the small fixed set of
settings the tuner times per algorithm (every one valid for the shaders'
constraints: runtime/families/conv2d_tiling.py, templates/q8ta_gemm.glsl.j2),
and `choice_from_json` accepts only those, so a cache entry can never carry
settings a shader was not measured with. A tiling over the device's shared
memory is refused when its pipeline is built (runtime/vulkan/workgroup_memory.py
reads the size from the SPIR-V), and the tuner lists it among those that
cannot run.

Pure Python: no Vulkan, no files (runtime/ops/tuning.py stores choices, the
tuner in runtime/tools/tuner.py measures them). Called by those two, the
layout resolver (conv2d_layouts.py) and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.families.conv2d import Conv2dParams
from runtime.vulkan.layouts import PACKED_LAYOUTS

ALGORITHMS = ("pw", "dw", "im2col", "general", "pw_coop", "im2col_coop")
GEMM_ALGORITHMS = ("pw", "im2col")
COOP_ALGORITHMS = ("pw_coop", "im2col_coop")  # the cooperative-matrix GEMM: K_SPLITS and CHUNK to tune
GEMM_SETTINGS = ("tile_m", "tile_n4", "threads_n", "split_k", "block_k")
DIRECT_OUT_W = 4  # OUT_W of general and dw when nothing was measured
# (tile_m, tile_n4, threads_n, split_k, block_k): one slice with 8 or 16 invocations along
# the channels, K split 2 to 16 ways, and one wider tile of 2 channel words.
GEMM_CANDIDATES = (
    (4, 1, 8, 1, 8), (4, 1, 16, 1, 8), (4, 1, 16, 2, 8), (4, 1, 8, 4, 4),
    (4, 1, 8, 8, 4), (4, 1, 4, 16, 4), (4, 2, 8, 1, 8),
)
OUT_W_CANDIDATES = (1, 2, 4, 8)
COOP_K_SPLITS_CANDIDATES = (1, 2, 4, 8)
# K bytes a coop GEMM stages per chunk (its CHUNK axis, k64 or k128). The rule picks by tile count
# (conv2d_tiling.coop_chunk), but no such rule fits every layer: on the H200, 128-byte chunks
# took 0.97x the time of the rule's 64-byte ones on ResNet-50 b32 l2 3x3 and 1.25x on l3 3x3
# (benchmarks/NOTES.md, session 15).
COOP_CHUNK_CANDIDATES = (64, 128)


@dataclass(frozen=True)
class Conv2dChoice:
    """One way to run a conv, and (when measured) its GPU seconds per call.

    Attributes:
        algorithm: one of `ALGORITHMS`.
        layout: the packed input layout (one of `PACKED_LAYOUTS`).
        settings: (name, value) pairs: the `GEMM_SETTINGS` of pw and im2col,
            ``k_splits`` and ``chunk`` of the coop GEMMs (``k_splits`` alone in caches
            written before chunks were measured: the rule's chunk) or ``out_w`` of general
            and dw;
            empty for the op's own rule.
        seconds: the measured median GPU time of one call, or None.
    """

    algorithm: str
    layout: str
    settings: tuple[tuple[str, int], ...] = ()
    seconds: float | None = None

    def setting(self, name: str) -> int | None:
        """The value of one setting, or None when the rule decides it."""
        return dict(self.settings).get(name)

    @property
    def settings_label(self) -> str:
        """The settings as short text: ``t4x1 n16 k2x8`` (TILE_M x TILE_N4, THREADS_N,
        SPLIT_K x BLOCK_K), ``ks4 c128`` (K_SPLITS, K bytes per chunk), ``w8`` (OUT_W), or
        ``(rule)``."""
        s = dict(self.settings)
        if self.algorithm in GEMM_ALGORITHMS and s:
            return f"t{s['tile_m']}x{s['tile_n4']} n{s['threads_n']} k{s['split_k']}x{s['block_k']}"
        if "k_splits" in s:
            return f"ks{s['k_splits']}" + (f" c{s['chunk']}" if "chunk" in s else "")
        return f"w{s['out_w']}" if "out_w" in s else "(rule)"

    @property
    def label(self) -> str:
        """Short text for tables: ``im2col 4C t4x1 n16 k2x8``, ``general 4C1W w8``."""
        return f"{self.algorithm} {self.layout} {self.settings_label}"

    def to_json(self) -> dict:
        """The choice as a JSON object (`choice_from_json` reads it back)."""
        return {"algorithm": self.algorithm, "layout": self.layout,
                "settings": dict(self.settings), "seconds": self.seconds}


def gemm_settings(values) -> tuple[tuple[str, int], ...]:
    """The (name, value) settings of a GEMM tiling given as a `GEMM_CANDIDATES` tuple."""
    return tuple(zip(GEMM_SETTINGS, values, strict=True))


def choice_from_json(data) -> Conv2dChoice:
    """Reads a `Conv2dChoice.to_json` object back.

    Raises:
        ValueError: not such an object, or an algorithm, layout or settings
            the tuner never measures.
    """
    if not isinstance(data, dict) or set(data) != {"algorithm", "layout", "settings", "seconds"}:
        raise ValueError(f"not a conv choice: {data!r}")
    algorithm, layout, settings, seconds = (data[k] for k in ("algorithm", "layout", "settings", "seconds"))
    if algorithm not in ALGORITHMS or layout not in PACKED_LAYOUTS:
        raise ValueError(f"unknown algorithm {algorithm!r} or layout {layout!r}")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
        raise ValueError(f"seconds must be a number > 0, got {seconds!r}")
    if not isinstance(settings, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in settings.values()):
        raise ValueError(f"settings must be an object of ints, got {settings!r}")
    if algorithm in GEMM_ALGORITHMS:
        known = [dict(gemm_settings(c)) for c in GEMM_CANDIDATES]
        ordered = gemm_settings(settings.get(k) for k in GEMM_SETTINGS) if settings else ()
    elif algorithm in COOP_ALGORITHMS:
        known = [dict(c) for c in candidate_settings(algorithm)]
        known += [{"k_splits": k} for k in COOP_K_SPLITS_CANDIDATES]  # written before chunks were measured
        ordered = tuple(settings.items())
    else:
        known = [{"out_w": w} for w in OUT_W_CANDIDATES]
        ordered = tuple(settings.items())
    if settings and settings not in known:
        raise ValueError(f"settings {settings} of {algorithm} are not among the tuner's candidates")
    return Conv2dChoice(algorithm, layout, ordered, float(seconds))


def candidate_algorithms(p: Conv2dParams) -> list[str]:
    """The algorithms whose op accepts the geometry: pw (1x1, stride 1, padding 0), dw
    (depthwise), im2col (one group, or ``C_in / groups % 4 == 0``), general (any), and pw and im2col on the
    cooperative-matrix GEMM (one group, and for im2col `Conv2dParams.im2col_coop_eligible`; the
    tuner skips them where the device cannot run them)."""
    valid = {"pw": p.is_pointwise, "dw": p.is_depthwise, "im2col": p.im2col_eligible, "general": True,
             "pw_coop": p.is_pointwise and p.groups == 1, "im2col_coop": p.im2col_coop_eligible}
    return [a for a in ALGORITHMS if valid[a]]


def candidate_settings(algorithm: str) -> list[tuple[tuple[str, int], ...]]:
    """The settings the tuner times for `algorithm`: the GEMM tilings, the K splits and chunks
    of the coop GEMMs, or the OUT_W values of general and dw."""
    if algorithm in GEMM_ALGORITHMS:
        return [gemm_settings(c) for c in GEMM_CANDIDATES]
    if algorithm in COOP_ALGORITHMS:
        return [(("k_splits", k), ("chunk", c)) for k in COOP_K_SPLITS_CANDIDATES
                for c in COOP_CHUNK_CANDIDATES]
    return [(("out_w", w),) for w in OUT_W_CANDIDATES]
