"""The cooperative-matrix int8 GEMMs of the pointwise and im2col convs (shaders q8ta_gemm_coop
and q8ta_gemm_coop_im2col, which gathers the im2col rows itself).

On the CPU: the weight prepack, and the gating of the variant on what a device
reports (fake capabilities: only the exact shape, types, scope and subgroup
size run it). On a device that runs it: both coop ops, bit-exact against the
OPS.md reference over shapes with ragged M, K and C_out, every activation and
every input layout, K split into ranges (K_SPLITS) in every layout, the
epilogue's residual add and lookup table, and the dispatcher routing large GEMMs to it. On a
device without it (lavapipe) the device tests are skipped with the reason, and
the dispatcher is checked to fall back to the existing GEMM. The split's second step, q8ta_gemm_coop_reduce,
needs no cooperative matrices and is tested alone everywhere, with and without
the residual add or the lookup table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch
from conv_testlib import assert_bit_exact, packed_bytes, random_lut, residual_args

import runtime
from runtime.families import conv2d as conv2d_module
from runtime.families.conv2d_tiling import coop_a_load, coop_chunk, coop_k_splits, prefers_coop_gemm
from runtime.families.conv2d_tuning import Conv2dChoice, candidate_algorithms
from runtime.ops import tuning
from runtime.ops.library import catalog
from runtime.ops.stub_support import layout_code
from runtime.reference import conv2d as ref
from runtime.reference.quantize import fp32, fp32_recip
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs
from runtime.vulkan.coopmat import COOPMAT_CAPABILITIES, CoopMatrixShape, coopmat_gap
from runtime.vulkan.device import Capabilities, Limits, get_device
from runtime.vulkan.layouts import PACKED_LAYOUTS, pack
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

VARIANT = "q8ta_gemm_coop_k64_w4"
COOP_GEMMS = "q8ta_gemm_coop"  # the prefix of every coop GEMM variant
CAPABILITY = "coopmat_s8_16x16x32_sg32"
EXACT = CoopMatrixShape(16, 16, 32, "s8", "s8", "s32", "s32", "subgroup")
PW = "etvk.q8ta_conv2d_pw_coop.default"
IM2COL = "etvk.q8ta_conv2d_im2col_coop.default"

C = Conv2dCase
# M = N * H_out * W_out pixels (tiles of 64), K = C_in * KH * KW bytes (chunks of 64), C_out
# (tiles of 64): each is ragged somewhere. C_in % 16 == 0 stages the (4C) input 16 bytes at a
# time (A_LOAD w16), other C_in 4 bytes (w4); the cases cover both with either K chunk.
PW_CASES = [
    C("pw_m1054_k40_n72", 2, 40, 17, 31, 72, (1, 1), activation="relu"),
    C("pw_tiny_k6_n7", 1, 6, 5, 9, 7, (1, 1), bias=False),
    C("pw_k200_n130_hardswish", 1, 200, 9, 13, 130, (1, 1), activation="hardswish"),
    C("pw_m64_k64_n64", 1, 64, 8, 8, 64, (1, 1), activation="hardtanh", activation_min=-1.0,
      activation_max=2.5),
    C("pw_k96_n80_relu", 1, 96, 9, 11, 80, (1, 1), activation="relu"),
]
IM2COL_CASES = [
    C("im2col_3x3_k180_n68", 2, 20, 20, 31, 68, (3, 3), padding=(1, 1), activation="hardtanh"),
    C("im2col_3x3s2_k576_n64", 1, 64, 14, 15, 64, (3, 3), (2, 2), (1, 1), activation="relu"),
    C("im2col_dilated_k144_n10", 1, 16, 12, 12, 10, (3, 3), padding=(2, 2), dilation=(2, 2),
      bias=False),
    C("im2col_1x7_k56_n200", 1, 8, 6, 13, 200, (1, 7), padding=(0, 3), activation="hardswish"),
    # The implicit im2col's tap walk: 3 input channel words per tap (several taps per chunk),
    # 20 (chunks across taps), 32 (whole chunks per tap) over two images.
    C("im2col_5x5s21_k300_n64", 1, 12, 11, 9, 64, (5, 5), (2, 1), (2, 2)),
    C("im2col_3x3_c80_k720_n64", 1, 80, 7, 9, 64, (3, 3), padding=(1, 1), activation="relu"),
    C("im2col_3x3_b2_k1152_n96", 2, 128, 9, 10, 96, (3, 3), padding=(1, 1)),
    # 18432 pixels x 64 channels: 288 tiles, so 64-byte K chunks (the others stage 128 bytes).
    C("im2col_3x3_m18432_k144_n64", 2, 16, 96, 96, 64, (3, 3), padding=(1, 1), activation="relu"),
    C("im2col_3x3_m18432_k108_n40", 2, 12, 96, 96, 40, (3, 3), padding=(1, 1)),
    # A stem: 3 channels, one word per tap (its fourth byte a padding channel, zero weights):
    # K = 49 x 4 = 196 bytes.
    C("im2col_7x7s2_c3_k196_n64", 1, 3, 30, 27, 64, (7, 7), (2, 2), (3, 3), activation="relu"),
]
# One case per kernel and K chunk for the layout test.
LAYOUT_CASES = ("pw_m1054_k40_n72", "pw_k200_n130_hardswish", "im2col_3x3_k180_n68",
                "im2col_3x3_m18432_k144_n64", "im2col_7x7s2_c3_k196_n64")


def _caps(**changes) -> Capabilities:
    """Capabilities of a made-up device that runs the coop GEMM; `changes` take things away."""
    limits = Limits(1 << 30, 1 << 30, (65535,) * 3, (1024, 1024, 64), 1024, 49152, 2048, 16384,
                    256, 64)
    caps = Capabilities(
        name="fake", vendor_id=0x10DE, device_id=1, device_type="discrete_gpu",
        api_version="1.3.280", driver_id=0, driver_name="", driver_info="", driver_version=0,
        family="nvidia", family_overridden=False,
        features=frozenset({"cooperative_matrix", "shader_int8", "vulkan_memory_model", "maintenance4"}),
        dot4x8_signed_accelerated=True, subgroup_size=32, subgroup_size_range=(32, 32),
        limits=limits, timestamp_period=1.0,
        timestamps=True, storage_image_formats=frozenset(), pipeline_cache_uuid=b"",
        cooperative_matrices=(CoopMatrixShape(16, 8, 32, "s8", "s8", "s32", "s32", "subgroup"),
                              EXACT))
    return dataclasses.replace(caps, **changes)


@pytest.mark.parametrize(("changes", "reason"), [
    ({}, ""),
    ({"features": frozenset({"shader_int8", "vulkan_memory_model", "maintenance4"})},
     "cooperative_matrix is not enabled"),
    ({"api_version": "1.2.198"}, "Vulkan 1.2 < 1.3"),
    ({"subgroup_size": 64}, "subgroup size 64, not 32"),
    ({"subgroup_size_range": (16, 32)}, "subgroup sizes 16-32 may vary, the shader needs 32"),
    ({"subgroup_size_range": ()}, "subgroup sizes unknown may vary"),
    ({"cooperative_matrices": (dataclasses.replace(EXACT, n=8),)},
     "no cooperative matrix 16x16x32 s8 x s8 + s32 -> s32 (subgroup)"),
    ({"cooperative_matrices": (dataclasses.replace(EXACT, scope="workgroup"),)}, "no cooperative"),
    ({"cooperative_matrices": (dataclasses.replace(EXACT, c="s16", result="s16"),)},
     "no cooperative"),
    ({"cooperative_matrices": (dataclasses.replace(EXACT, a="u8"),)}, "no cooperative"),
    ({"cooperative_matrices": (dataclasses.replace(EXACT, saturating=True),)}, "no cooperative"),
    ({"cooperative_matrices": ()}, "no cooperative"),
])
def test_the_variant_runs_only_with_the_exact_shape(changes, reason):
    caps = _caps(**changes)
    ok, why = catalog().variant(VARIANT).runnable(caps)
    assert caps.supports(CAPABILITY) == (not reason) == ok
    assert caps.why_not(CAPABILITY).startswith(reason)
    if reason:
        assert why.startswith(f"fake lacks {CAPABILITY} ({reason}")


def test_the_variant_needs_int8_the_vulkan_memory_model_and_maintenance4():
    for feature in ("shader_int8", "vulkan_memory_model", "maintenance4"):
        caps = _caps(features=frozenset({"cooperative_matrix", "shader_int8",
                                         "vulkan_memory_model", "maintenance4"} - {feature}))
        ok, why = catalog().variant(VARIANT).runnable(caps)
        assert not ok and feature in why


def test_a_held_back_feature_is_the_reason():
    caps = _caps(features=frozenset({"shader_int8"}),
                 held_back=(("cooperative_matrix", "the validation layer predates it"),))
    assert caps.why_not(CAPABILITY) == "the validation layer predates it"


def test_capability_table_names_its_shape():
    assert COOPMAT_CAPABILITIES[CAPABILITY] == (EXACT, 32)
    assert coopmat_gap(CAPABILITY, {"cooperative_matrix"}, (EXACT,), 32, (32, 32), (1, 4)) == ""


def test_pack_gemm_coop_weights():
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (70, 5, 3, 3), dtype=torch.int8, generator=gen)
    words = conv2d_module.pack_gemm_coop_weights(w)
    k, kp, rows = 72, 128, 128  # 9 taps of 5 channels padded to 8 (two words)
    assert words.dtype == torch.int32 and words.numel() == rows * kp // 4
    packed = words.view(torch.int8).reshape(rows, kp)  # little-endian: byte k % 4 of word k / 4
    for oc in (0, 33, 69):
        for ky, kx, ic in ((0, 0, 0), (1, 2, 4), (2, 1, 3)):
            assert packed[oc, (ky * 3 + kx) * 8 + ic] == w[oc, ic, ky, kx]
    assert not packed.reshape(rows, kp // 8, 8)[:, :9, 5:].any()  # each tap's padding channels
    assert not packed[:, k:].any() and not packed[70:].any()


def test_pack_gemm_coop_weights_rejects_non_int8():
    with pytest.raises(ValueError, match="int8"):
        conv2d_module.pack_gemm_coop_weights(torch.zeros(4, 4, 1, 1))


def test_shape_rule():
    for kernel in ("pw", "im2col"):
        assert prefers_coop_gemm(kernel, 1024, 64, 64, 1)
        assert not prefers_coop_gemm(kernel, 1023, 64, 64, 1)
        assert prefers_coop_gemm(kernel, 4096, 64, 32, 1)  # half a tile of channels
        assert not prefers_coop_gemm(kernel, 4096, 64, 31, 1)
        assert not prefers_coop_gemm(kernel, 4096, 63, 64, 1)
        assert not prefers_coop_gemm(kernel, 4096, 64, 64, 2)
    # a long K: the implicit im2col at any pixel count, the pointwise GEMM only with 32 tiles
    assert prefers_coop_gemm("im2col", 49, 1024, 64, 1)
    assert not prefers_coop_gemm("im2col", 49, 1023, 64, 1)
    assert not prefers_coop_gemm("pw", 49, 4096, 64, 1)
    assert prefers_coop_gemm("pw", 196, 512, 512, 1)  # 4 x 8 tiles
    assert not prefers_coop_gemm("pw", 196, 511, 512, 1)
    assert not prefers_coop_gemm("pw", 196, 1024, 448, 1)  # 4 x 7 tiles
    with pytest.raises(ValueError, match="kernel must be one of"):
        prefers_coop_gemm("dw", 4096, 64, 64, 1)


@pytest.mark.parametrize("kernel", ["pw", "im2col"])
def test_coop_chunk_by_tiles(kernel):
    """128-byte K chunks up to 256 output tiles of 64 x 64, 64-byte ones past that or where K
    fits one 64-byte chunk."""
    assert coop_chunk(kernel, 256 * 64, 576, 64) == "k128"
    assert coop_chunk(kernel, 128 * 64, 65, 128) == "k128"
    assert coop_chunk(kernel, 128 * 64, 64, 128) == "k64"
    assert coop_chunk(kernel, 256 * 64 + 1, 576, 64) == "k64"
    assert coop_chunk(kernel, 128 * 64, 576, 129) == "k64"


@pytest.mark.parametrize("kernel", ["pw", "im2col"])
def test_a_measured_chunk_wins_and_sets_the_k_splits_rule_chunks(kernel):
    assert coop_chunk(kernel, 4096 * 64, 576, 64, {"chunk": 128}) == "k128"  # the rule: k64
    assert coop_chunk(kernel, 8 * 64, 4608, 64, {"chunk": 64}) == "k64"  # the rule: k128
    assert coop_chunk(kernel, 8 * 64, 4608, 64, {"k_splits": 2}) == "k128"  # no chunk: the rule
    # K = 1920 bytes: 30 chunks of 64 split 8 ways; 15 of 128 are under COOP_SPLIT_MIN_CHUNKS
    assert coop_k_splits(kernel, 8 * 64, 15 * 128, 64, {"chunk": 64}) == 8
    assert coop_k_splits(kernel, 8 * 64, 15 * 128, 64, {"chunk": 128}) == 1


def test_coop_chunk_by_k_pointwise_only():
    """From 2048 K bytes the pointwise GEMM takes 128-byte chunks at any tile count."""
    assert coop_chunk("pw", 4096, 2048, 4096) == "k128"
    assert coop_chunk("pw", 4096, 2047, 4096) == "k64"
    assert coop_chunk("im2col", 4096, 4608, 4096) == "k64"
    with pytest.raises(ValueError, match="kernel must be one of"):
        coop_chunk("direct", 4096, 4608, 4096)


def _require_coop():
    ok, reason = catalog().variant(VARIANT).runnable(get_device().caps)
    if not ok:
        pytest.skip(f"{VARIANT} does not run here: {reason}")


def _dispatched(trace_path, before: int) -> list[str]:
    lines = trace_path.read_text().splitlines() if trace_path.exists() else []
    return [json.loads(line)["variant"] for line in lines[before:]]


def _trace_length(trace_path) -> int:
    return len(trace_path.read_text().splitlines()) if trace_path.exists() else 0


def _coop_variant(op_name: str, case: Conv2dCase, layout: str = "4C") -> str:
    """The variant the coop op runs for the case with its input in `layout`: the rule's K chunk
    and input loads."""
    p = case.params
    kernel, shader = ("pw", "q8ta_gemm_coop") if op_name == PW else ("im2col", "q8ta_gemm_coop_im2col")
    chunk = coop_chunk(kernel, p.N * p.H_out * p.W_out, p.gemm_k, p.C_out)
    return f"{shader}_{chunk}_{coop_a_load(layout, p.C_in)}"


def test_the_cases_dispatch_every_coop_gemm_variant():
    cases = [(PW, c) for c in PW_CASES] + [(IM2COL, c) for c in IM2COL_CASES]
    covered = {_coop_variant(op_name, case) for op_name, case in cases}
    variants = {v.name for v in catalog().variants()
                if v.name.startswith(COOP_GEMMS) and v.name != "q8ta_gemm_coop_reduce"}
    assert len(variants) == 8 and covered == variants


@pytest.mark.parametrize(("layout", "c_in", "expected"), [
    ("4C", 16, "w16"), ("4C", 1024, "w16"), ("4C", 24, "w4"), ("4C", 4, "w4"),
    ("4W4C", 64, "w4"), ("4C1W", 64, "w4")])
def test_coop_a_load_rule(layout, c_in, expected):
    """16-byte staging loads only where a 4C pixel's K words come in aligned runs of 4."""
    assert coop_a_load(layout, c_in) == expected


@pytest.mark.parametrize(("op_name", "case"),
                         [(PW, c) for c in PW_CASES] + [(IM2COL, c) for c in IM2COL_CASES],
                         ids=lambda v: v.name if isinstance(v, Conv2dCase) else v.split(".")[1])
def test_coop_matches_the_reference(op_name, case, dispatch_trace_path):
    _require_coop()
    inp = make_inputs(case)
    before = _trace_length(dispatch_trace_path)
    variant = _coop_variant(op_name, case)
    got = runtime.get_op(op_name)(*inp.args())
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"{op_name} {case.name}")
    assert _dispatched(dispatch_trace_path, before) == [variant]


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("op_name", "case"),
                         [(PW, c) for c in PW_CASES if c.name in LAYOUT_CASES]
                         + [(IM2COL, c) for c in IM2COL_CASES if c.name in LAYOUT_CASES],
                         ids=lambda v: v.name if isinstance(v, Conv2dCase) else v.split(".")[1])
def test_coop_reads_and_writes_every_layout(op_name, case, layout, dispatch_trace_path):
    _require_coop()
    inp = make_inputs(case)
    before = _trace_length(dispatch_trace_path)
    with Stream() as stream:
        out = runtime.get_op(op_name).record(stream, Tensor.from_torch(inp.x, layout=layout),
                                             *inp.args()[1:])
        stream.run()
        assert out.layout == layout
        assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args()), f"{op_name} {layout}")
    assert _dispatched(dispatch_trace_path, before) == [_coop_variant(op_name, case, layout)]


SPLIT_CASES = ("pw_m1054_k40_n72", "pw_tiny_k6_n7", "pw_k200_n130_hardswish", "im2col_3x3_k180_n68",
               "im2col_5x5s21_k300_n64", "im2col_3x3_b2_k1152_n96", "im2col_7x7s2_c3_k196_n64")


@pytest.mark.parametrize("k_splits", [2, 4, 8])
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("op_name", "case"),
                         [(PW, c) for c in PW_CASES if c.name in SPLIT_CASES]
                         + [(IM2COL, c) for c in IM2COL_CASES if c.name in SPLIT_CASES],
                         ids=lambda v: v.name if isinstance(v, Conv2dCase) else v.split(".")[1])
def test_coop_split_along_k(op_name, case, layout, k_splits, dispatch_trace_path):
    """K in ranges (dispatch z; more ranges than chunks leaves some empty), their int32 sums
    added by q8ta_gemm_coop_reduce: the same bits as one range, in every layout."""
    _require_coop()
    inp = make_inputs(case)
    algorithm = "pw_coop" if op_name == PW else "im2col_coop"
    before = _trace_length(dispatch_trace_path)
    with Stream() as stream, tuning.forcing(Conv2dChoice(algorithm, layout, (("k_splits", k_splits),))):
        out = runtime.get_op(op_name).record(stream, Tensor.from_torch(inp.x, layout=layout),
                                             *inp.args()[1:])
        stream.run()
        got = out.to_torch()
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"{op_name} {layout} K_SPLITS={k_splits}")
    assert _dispatched(dispatch_trace_path, before) == [_coop_variant(op_name, case, layout),
                                                      "q8ta_gemm_coop_reduce"]


@pytest.mark.parametrize("epilogue", ["residual", "lut"])
@pytest.mark.parametrize("k_splits", [1, 2])
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("op_name", "case"),
                         [(PW, c) for c in PW_CASES if c.name in LAYOUT_CASES]
                         + [(IM2COL, c) for c in IM2COL_CASES if c.name in LAYOUT_CASES],
                         ids=lambda v: v.name if isinstance(v, Conv2dCase) else v.split(".")[1])
def test_coop_adds_a_residual_or_applies_a_table(op_name, case, layout, k_splits, epilogue):
    """The epilogue's residual add (and relu) or lookup table on both coop GEMMs, in one range
    (the GEMM's epilogue; the rule splits none of these cases) and split along K
    (q8ta_gemm_coop_reduce's): the bytes of conv -> q8ta_add or conv -> q8ta_lut in every
    layout, padding included."""
    _require_coop()
    inp = make_inputs(case)
    extra = residual_args(inp, case.params.output_shape, 6, "relu") if epilogue == "residual" else ()
    table = random_lut(6) if epilogue == "lut" else None
    algorithm = "pw_coop" if op_name == PW else "im2col_coop"
    forced = tuning.forcing(Conv2dChoice(algorithm, layout, (("k_splits", k_splits),))) if k_splits > 1 \
        else contextlib.nullcontext()
    with Stream() as stream, forced:
        residual = (Tensor.from_torch(extra[0], layout=layout), *extra[1:]) if extra else ()
        out = runtime.get_op(op_name).record(stream, Tensor.from_torch(inp.x, layout=layout), *inp.args()[1:],
                                             *residual, lut=table)
        stream.run()
        want = ref.q8ta_conv2d(*inp.args(), *extra, lut=table)
        assert_bit_exact(out.to_torch(), want, f"{op_name} {layout} K_SPLITS={k_splits} {epilogue}")
        assert torch.equal(packed_bytes(out), pack(want, layout)), f"{op_name} {layout}: padding"


@pytest.mark.parametrize("epilogue", ["plain", "residual", "lut"])
@pytest.mark.parametrize("k_splits", [1, 3])
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("case", [c for c in PW_CASES if c.name in SPLIT_CASES], ids=lambda c: c.name)
def test_reduce_adds_the_ranges_and_requantizes(case, layout, k_splits, epilogue):
    """q8ta_gemm_coop_reduce alone (it needs no cooperative matrices, so it runs everywhere):
    the exact int32 GEMM sums cut into random ranges, junk in the tile padding, give the
    reference conv's bytes in the output layout, with the epilogue's residual add or table where asked
    (padding bytes included: those of the reference packed)."""
    inp = make_inputs(case)
    p = case.params
    x, w = inp.x.permute(0, 2, 3, 1).to(torch.int64), inp.weights.flatten(1).to(torch.int64)
    wp = -(-p.W // 4) * 4 if layout == "4W4C" else p.W
    sums = torch.zeros(p.N, p.H, wp, p.C_out, dtype=torch.int64)
    sums[:, :, :p.W] = x @ w.T  # GEMM row m = (n * H + h) * wp + w
    m = p.N * p.H * wp
    mp, np_ = -(-m // 64) * 64, -(-p.C_out // 64) * 64
    gen = torch.Generator().manual_seed(k_splits)
    partials = torch.randint(-(1 << 20), 1 << 20, (k_splits, mp, np_), dtype=torch.int64, generator=gen)
    partials[-1, :m, :p.C_out] = sums.reshape(m, p.C_out) - partials[:-1, :m, :p.C_out].sum(0)
    variant = catalog().variant("q8ta_gemm_coop_reduce")
    lo, hi = conv2d_module.conv2d_output_bounds(inp.activation, inp.activation_min, inp.activation_max,
                                                inp.output_scale, inp.output_zero_point)
    extra = residual_args(inp, p.output_shape, k_splits, "relu") if epilogue == "residual" \
        else (None, 1.0, 0, 1.0, 0, "none")
    table = random_lut(k_splits) if epilogue == "lut" else None
    with Stream() as stream:
        out = stream.empty([p.N, p.C_out, p.H, p.W], torch.int8, variant.binding("t_out"), layout=layout)
        stream.dispatch(variant, "test.reduce", bindings={
            "t_out": out, "t_partials": stream.upload(partials.to(torch.int32), variant.binding("t_partials")),
            "t_weight_sums": stream.upload(inp.weight_sums, variant.binding("t_weight_sums")),
            "t_weight_scales": stream.upload(inp.weight_scales, variant.binding("t_weight_scales")),
            "t_bias": stream.upload(inp.bias, variant.binding("t_bias")),
            "t_residual": stream.upload(extra[0], variant.binding("t_residual"), layout=layout),
            "t_lut": stream.upload(table, variant.binding("t_lut"))},
            push={"out_sizes": [p.W, p.H, p.C_out, p.N], "partials": [k_splits, mp, np_, wp],
                  "hardswish": int(inp.activation == "hardswish"), "input_scale": inp.input_scale,
                  "inv_output_scale": fp32_recip(inp.output_scale), "input_zero_point": inp.input_zero_point,
                  "output_zero_point": inp.output_zero_point, "output_min": lo, "output_max": hi,
                  "conv_scale": fp32(inp.output_scale), "residual_scale": fp32(extra[1]),
                  "residual_zero_point": extra[2], "add_inv_output_scale": fp32_recip(extra[3]),
                  "add_output_zero_point": extra[4]},
            global_size=[m * -(-p.C_out // 4), 1, 1],
            spec_constants={"OUT_LAYOUT": layout_code(layout), "RESIDUAL": 2 * (epilogue == "residual"),
                            "HAS_LUT": int(epilogue == "lut")})
        stream.run()
        want = ref.q8ta_conv2d(*inp.args(), *extra, lut=table)
        assert_bit_exact(out.to_torch(), want, f"reduce {layout} {k_splits}")
        assert torch.equal(packed_bytes(out), pack(want, layout)), f"reduce {layout} {k_splits}: padding"


@pytest.mark.parametrize("kernel", ["pw", "im2col"])
def test_coop_k_splits_rule(kernel):
    """Up to 64 tiles and from 16 chunks, ranges double while each keeps 2 chunks and the
    workgroups stay within 256; a measured setting wins."""
    # Few tiles take 128-byte chunks: K = 4608 bytes is 36 of them.
    assert coop_k_splits(kernel, 8 * 64, 4608, 64) == 8
    assert coop_k_splits(kernel, 56 * 64, 4608, 64) == 4        # 8 ranges: 448 workgroups
    assert coop_k_splits(kernel, 64 * 64, 4608, 64) == 4
    assert coop_k_splits(kernel, 65 * 64, 4608, 64) == 1
    assert coop_k_splits(kernel, 8 * 64, 16 * 128, 64) == 8     # 2 chunks per range
    assert coop_k_splits(kernel, 8 * 64, 20 * 128, 64) == 8
    assert coop_k_splits(kernel, 8 * 64, 15 * 128, 64) == 1     # under 16 chunks
    assert coop_k_splits(kernel, 8 * 64, 4608, 64, {"k_splits": 8}) == 8


# Shapes the rule sends to the cooperative-matrix GEMM: 1024 pixels, K of 64 bytes or more.
ROUTED_CASES = [
    C("pw_m1024_k512_n64", 1, 512, 32, 32, 64, (1, 1), activation="relu"),
    C("pw_m1024_k64_n64", 1, 64, 32, 32, 64, (1, 1)),
    C("im2col_3x3_k576_n72", 1, 64, 32, 32, 72, (3, 3), padding=(1, 1)),
]


@pytest.mark.parametrize("case", ROUTED_CASES, ids=lambda c: c.name)
def test_dispatcher_routes_large_gemms_by_capability(case, dispatch_trace_path):
    """Coop where the device runs it and the shape suits it, else the existing GEMM."""
    inp = make_inputs(case)
    p = case.params
    kernel = "pw" if p.is_pointwise else "im2col"
    assert prefers_coop_gemm(kernel, p.N * p.H_out * p.W_out, p.gemm_k, p.C_out, p.groups)
    coop = catalog().variant(VARIANT).runnable(get_device().caps)[0]
    before = _trace_length(dispatch_trace_path)
    got = runtime.get_op("etvk.q8ta_conv2d.default")(*inp.args())
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"dispatcher {case.name}")
    gemms = [v for v in _dispatched(dispatch_trace_path, before) if v.startswith("q8ta_gemm")]
    expected = _coop_variant(PW if p.is_pointwise else IM2COL, case)
    if coop:
        assert gemms == [expected], gemms
    else:
        assert gemms and not any(v.startswith(COOP_GEMMS) for v in gemms), gemms


def test_dispatcher_keeps_small_gemms_off_coop(dispatch_trace_path):
    case = PW_CASES[1]  # 45 pixels
    inp = make_inputs(case)
    before = _trace_length(dispatch_trace_path)
    runtime.get_op("etvk.q8ta_conv2d.default")(*inp.args())
    assert not any(v.startswith(COOP_GEMMS) for v in _dispatched(dispatch_trace_path, before))


def test_im2col_coop_eligibility_bounds_the_tap_extent():
    def params(width: int, pad: int):
        return conv2d_module.conv2d_params([1, 4, 1, width], [4, 4, 1, 3], [1, 3], 1, [0, pad], 1, 1)

    assert params(32765, 1).im2col_coop_eligible  # W + 2 * pad_x = 32767
    assert not params(32766, 1).im2col_coop_eligible
    assert "im2col_coop" in candidate_algorithms(params(32765, 1))
    assert "im2col_coop" not in candidate_algorithms(params(32766, 1))


def test_coop_im2col_refuses_inputs_past_16_bit_taps():
    """The implicit im2col keeps tap coordinates in 16 bits: the op says so before any dispatch."""
    inp = make_inputs(C("wide", 1, 4, 1, 32766, 4, (1, 3), padding=(0, 1)))
    with pytest.raises(Exception, match=r"below 32768, got H=1, W=32766, padding=\[0, 1\]"):
        runtime.get_op(IM2COL)(*inp.args())


def test_coop_ops_refuse_groups():
    inp = make_inputs(C("g2", 1, 16, 6, 7, 24, (1, 1), groups=2))
    with pytest.raises(Exception, match="needs groups == 1, got 2"):
        runtime.get_op(PW)(*inp.args())
