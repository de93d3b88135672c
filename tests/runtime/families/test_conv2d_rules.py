"""Host rules of the int8 conv family (runtime/conv2d.py), as tables.

- geometry: output sizes against PyTorch's conv, the pointwise / depthwise /
  im2col flags;
- OPS.md rules 1-4: `prefers_im2col`, `choose_algorithm` and the placeholder
  resolver, for every GPU family;
- weight formats: each packing against a slow loop over its definition, and
  against a plain-torch model of the shader that reads it (the packed weights
  must give the same integer sums as the reference conv). No Vulkan.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from runtime.families.conv2d import (
    choose_algorithm,
    conv2d_params,
    direct_word_span,
    pack_depthwise_weights,
    pack_direct_weights,
    pack_gemm_weights,
    prefers_im2col,
    weight_sums,
)
from runtime.families.conv2d_layouts import PLACEHOLDER, PackedOp, resolve_packed_int8_conv2d
from runtime.families.conv2d_tuning import candidate_algorithms
from runtime.reference.conv2d import conv2d_accumulators
from runtime.vulkan.device import GPU_FAMILIES

P = PLACEHOLDER


def geom(c_in, c_out, k, hw, stride=1, pad=0, groups=1, dilation=1):
    """Conv2dParams of a square conv on an [1, c_in, *hw] input."""
    return conv2d_params((1, c_in, *hw), (c_out, c_in // groups, k, k), [k], [stride], [pad],
                         [dilation], groups)


@pytest.mark.parametrize(("hw", "k", "s", "p", "d"), [
    ((224, 224), 7, 2, 3, 1), ((56, 56), 3, 1, 1, 1), ((15, 15), 3, 2, 1, 1), ((9, 13), 3, 2, 0, 1),
    ((12, 12), 3, 1, 2, 2), ((5, 7), 5, 1, 4, 1), ((6, 6), 3, 3, 0, 2), ((1, 1), 1, 1, 0, 1),
])
def test_output_size_matches_pytorch(hw, k, s, p, d):
    params = conv2d_params((1, 1, *hw), (1, 1, k, k), [k, k], [s, s], [p], [d, d], 1)
    want = torch.nn.functional.conv2d(torch.zeros(1, 1, *hw), torch.zeros(1, 1, k, k), stride=s,
                                      padding=p, dilation=d).shape[2:]
    assert (params.H_out, params.W_out) == tuple(want)


def test_params_of_an_asymmetric_grouped_conv():
    p = conv2d_params((2, 12, 7, 11), (10, 6, 3, 5), [3, 5], [1, 2], [2, 1], [2, 1], 2)
    assert (p.N, p.C_in, p.H, p.W, p.C_out, p.KH, p.KW) == (2, 12, 7, 11, 10, 3, 5)
    assert (p.stride, p.padding, p.dilation, p.groups) == ((1, 2), (2, 1), (2, 1), 2)
    assert (p.Cg, p.Coutg, p.H_out, p.W_out, p.taps, p.Kg) == (6, 5, 7, 5, 15, 90)


@pytest.mark.parametrize(("x", "w", "args", "text"), [
    ((1, 8, 5, 5), (8, 8, 3), ([3], [1], [0], [1], 1), "4-D input and weights"),
    ((1, 8, 5, 5), (8, 8, 3, 3), ([3], [1], [0], [1], 3), "groups=3 must be a positive int dividing"),
    ((1, 8, 5, 5), (8, 4, 3, 3), ([3], [1], [0], [1], 1), "expected C_in/groups = 8"),
    ((1, 8, 5, 5), (8, 8, 3, 3), ([5], [1], [0], [1], 1), "does not match the weights' 3x3"),
    ((1, 8, 5, 5), (8, 8, 3, 3), ([3], [1, 1, 1], [0], [1], 1), "stride must be an int or a list"),
    ((1, 8, 5, 5), (8, 8, 3, 3), ([3], [0], [0], [1], 1), "must be >= 1"),
    ((1, 8, 2, 5), (8, 8, 3, 3), ([3], [1], [0], [1], 1), "the output would be 0x3"),
])
def test_bad_geometry_is_rejected(x, w, args, text):
    with pytest.raises(ValueError) as info:
        conv2d_params(x, w, *args)
    assert text in str(info.value)


# name: (params, prefers_im2col on mali, elsewhere, algorithm on mali, elsewhere)
RULES = {
    "3x3_c64_56x56": (geom(64, 64, 3, (56, 56), pad=1), True, True, "im2col", "im2col"),
    "3x3_c16_70x70": (geom(16, 16, 3, (70, 70), pad=1), True, False, "im2col", "general"),
    "3x3_c32_70x70": (geom(32, 16, 3, (70, 70), pad=1), True, True, "im2col", "im2col"),
    "3x3_c16_64x64_edge": (geom(16, 8, 3, (64, 64), pad=1), True, True, "im2col", "im2col"),
    "3x3_c16_17x241_edge": (geom(16, 8, 3, (17, 241), pad=1), True, False, "im2col", "general"),
    "3x3_c28_70x70": (geom(28, 8, 3, (70, 70), pad=1), True, False, "im2col", "general"),
    "7x7s2_c3": (geom(3, 64, 7, (224, 224), 2, 3), True, False, "im2col", "general"),
    "3x3s2_c3_small": (geom(3, 32, 3, (64, 64), 2, 1), True, True, "im2col", "im2col"),
    "3x3_c6_70x70": (geom(6, 16, 3, (70, 70), pad=1), True, False, "im2col", "general"),
    "grouped_g2_cg8": (geom(16, 16, 3, (8, 8), pad=1, groups=2), True, False, "im2col", "general"),
    "grouped_g2_cg64": (geom(128, 64, 3, (8, 8), pad=1, groups=2), True, False, "im2col", "general"),
    "grouped_g2_cg6": (geom(12, 10, 3, (8, 8), pad=1, groups=2), False, False, "general", "general"),
    "depthwise_c144": (geom(144, 144, 3, (56, 56), pad=1, groups=144), False, False, "dw", "dw"),
    "depthwise_c4": (geom(4, 4, 3, (8, 8), pad=1, groups=4), False, False, "dw", "dw"),
    "depthwise_1x1_c8": (geom(8, 8, 1, (8, 8), groups=8), False, False, "dw", "dw"),
    "pointwise_c6": (geom(6, 7, 1, (5, 9)), True, True, "pw", "pw"),
    "pointwise_c256_56x56": (geom(256, 64, 1, (56, 56)), True, True, "pw", "pw"),
    "pointwise_g2_cg8": (geom(16, 24, 1, (6, 7), groups=2), True, False, "im2col", "general"),
    "1x1s2_c64": (geom(64, 128, 1, (14, 14), 2), True, True, "im2col", "im2col"),
    "1x1_pad1_c8": (geom(8, 8, 1, (6, 6), pad=1), True, True, "im2col", "im2col"),
}


@pytest.mark.parametrize("family", GPU_FAMILIES)
@pytest.mark.parametrize("name", RULES)
def test_prefers_im2col_and_choose_algorithm(name, family):
    params, mali_im2col, other_im2col, mali_alg, other_alg = RULES[name]
    mali = family == "mali"
    assert prefers_im2col(params, family) == (mali_im2col if mali else other_im2col)
    want = NVIDIA_ALGORITHMS.get(name, other_alg) if family == "nvidia" else mali_alg if mali else other_alg
    assert choose_algorithm(params, family) == want


# Where NVIDIA's rule differs from the other families': pointwise convs of at most
# POINTWISE_DIRECT_MAX_C_IN input channels run the direct conv there.
NVIDIA_ALGORITHMS = {"pointwise_c6": "general"}


def test_flags():
    assert RULES["pointwise_c6"][0].is_pointwise and RULES["pointwise_g2_cg8"][0].is_pointwise
    assert not geom(12, 12, 1, (4, 4), groups=2).is_pointwise  # Cg = 6
    assert not RULES["1x1s2_c64"][0].is_pointwise and not RULES["1x1_pad1_c8"][0].is_pointwise
    assert RULES["depthwise_c144"][0].is_depthwise and not RULES["grouped_g2_cg8"][0].is_depthwise
    assert not geom(8, 16, 3, (4, 4), groups=8).is_depthwise  # channel multiplier 2
    assert RULES["grouped_g2_cg8"][0].im2col_eligible and not RULES["grouped_g2_cg6"][0].im2col_eligible
    assert RULES["7x7s2_c3"][0].im2col_eligible and RULES["7x7s2_c3"][0].im2col_coop_eligible


@pytest.mark.parametrize(("c_in", "groups", "k", "cg4", "gemm_k"), [
    (3, 1, 7, 4, 196), (1, 1, 3, 4, 36), (5, 1, 3, 8, 72), (8, 1, 3, 8, 72), (16, 2, 3, 8, 72),
    (6, 1, 1, 8, 8)])
def test_gemm_k_pads_each_taps_channels_to_whole_words(c_in, groups, k, cg4, gemm_k):
    p = geom(c_in, 2 * groups, k, (9, 9), pad=k // 2, groups=groups)
    assert (p.gemm_group_channels, p.gemm_k) == (cg4, gemm_k)


def stem(batch, c_out, k, stride, pad, c_in=3, hw=224):
    return conv2d_params((batch, c_in, hw, hw), (c_out, c_in, k, k), [k], [stride], [pad], [1], 1)


BOTH = frozenset({"pw", "im2col"})


@pytest.mark.parametrize(("params", "coop", "expected"), [
    # ResNet's stem: direct by rule 2 (3 channels, 112x112 outputs), the implicit im2col on
    # cooperative matrices where the device has them (K = 49 taps x 4 = 196 bytes, 64 channels).
    (stem(1, 64, 7, 2, 3), BOTH, "im2col_coop"),
    (stem(32, 64, 7, 2, 3), BOTH, "im2col_coop"),
    (stem(32, 64, 7, 2, 3), frozenset({"pw"}), "general"),
    (stem(32, 64, 7, 2, 3), frozenset(), "general"),
    # MobileNetV2's: K = 9 x 4 = 36 bytes, short of the coop GEMM's minimum
    # (conv2d_tiling.prefers_coop_gemm): direct.
    (stem(1, 32, 3, 2, 1), BOTH, "general"),
    (stem(32, 32, 3, 2, 1), BOTH, "general"),
    # Too few pixels for the coop GEMM: the family rule (im2col: at most 4096 output pixels).
    (stem(1, 64, 7, 2, 3, hw=56), BOTH, "im2col"),
    # 3 input channels: the direct conv on NVIDIA (POINTWISE_DIRECT_MAX_C_IN); 24 stay on pw,
    # 64 go to pw_coop.
    (conv2d_params((1, 3, 64, 64), (64, 3, 1, 1), [1], [1], [0], [1], 1), BOTH, "general"),
    (conv2d_params((1, 24, 8, 8), (64, 24, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw"),
    (conv2d_params((1, 64, 64, 64), (64, 64, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw_coop"),
    # Half a 64-channel tile (DenseNet's 32-channel growth convs) still on the coop GEMMs; a
    # quarter not. Few pixels: the implicit im2col from K = 1024 bytes (ResNet's 3x3 512 at
    # 7x7 and its 1x1 stride-2 1024->2048, batch 1), the pointwise GEMM from 32 tiles and K =
    # 512 bytes (ResNet's 1x1 1024->512 at 14x14, 4 x 8 tiles; not 1024->256, 4 x 4).
    (conv2d_params((1, 512, 7, 7), (512, 512, 3, 3), [3], [1], [1], [1], 1), BOTH, "im2col_coop"),
    (conv2d_params((1, 128, 14, 14), (32, 128, 3, 3), [3], [1], [1], [1], 1), BOTH, "im2col_coop"),
    (conv2d_params((1, 1024, 14, 14), (2048, 1024, 1, 1), [1], [2], [0], [1], 1), BOTH, "im2col_coop"),
    (conv2d_params((1, 512, 28, 28), (1024, 512, 1, 1), [1], [2], [0], [1], 1), BOTH, "im2col"),
    (conv2d_params((1, 1024, 14, 14), (256, 1024, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw"),
    (conv2d_params((1, 1024, 14, 14), (512, 1024, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw_coop"),
    (conv2d_params((32, 128, 28, 28), (32, 128, 3, 3), [3], [1], [1], [1], 1), BOTH, "im2col_coop"),
    (conv2d_params((32, 192, 28, 28), (32, 192, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw_coop"),
    (conv2d_params((32, 96, 112, 112), (16, 96, 1, 1), [1], [1], [0], [1], 1), BOTH, "pw"),
    (conv2d_params((1, 64, 64, 64), (64, 64, 1, 1), [1], [1], [0], [1], 1), frozenset({"im2col"}), "pw"),
    # Two groups: never coop; depthwise stays dw.
    (conv2d_params((1, 128, 64, 64), (128, 64, 3, 3), [3], [1], [1], [1], 2), BOTH, "general"),
    (conv2d_params((1, 64, 64, 64), (64, 1, 3, 3), [3], [1], [1], [1], 64), BOTH, "dw"),
], ids=str)
def test_choose_algorithm_moves_gemms_to_cooperative_matrices(params, coop, expected):
    assert choose_algorithm(params, "nvidia", coop) == expected


def test_unknown_family_is_rejected():
    with pytest.raises(ValueError, match="unknown GPU family 'Mali'"):
        prefers_im2col(RULES["3x3_c64_56x56"][0], "Mali")


# ---- placeholder resolution ----------------------------------------------------------------

PROGRAM = [
    PackedOp("etvk.q8ta_quantize.default", {"q": P}),
    PackedOp("etvk.q8ta_conv2d.default", {"q": P, "a": P}, RULES["3x3_c16_70x70"][0], "q"),
    PackedOp("etvk.q8ta_conv2d.default", {"a": P, "b": P}, RULES["depthwise_c144"][0], "a"),
    PackedOp("etvk.q8ta_conv2d.default", {"b": P, "c": P}, RULES["pointwise_c256_56x56"][0], "b"),
    PackedOp("etvk.q8ta_dequantize.default", {"c": P}),
]


def layouts_of(ops):
    return [dict(op.layouts) for op in ops]


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_resolver_on_a_program(family):
    # One class (each conv writes in its input's layout). The first conv is im2col on mali and
    # direct elsewhere, dw wants 4C1W and pw 4C: the majority is 4C on mali, 4C1W elsewhere.
    lay = "4C" if family == "mali" else "4C1W"
    assert layouts_of(resolve_packed_int8_conv2d(PROGRAM, family)) == [
        {"q": lay}, {"q": lay, "a": lay}, {"a": lay, "b": lay}, {"b": lay, "c": lay}, {"c": lay}]


def test_majority_of_a_class_wins_and_ties_go_to_the_first_conv():
    dw, pw = "etvk.q8ta_conv2d_dw.default", "etvk.q8ta_conv2d_pw.default"
    two_pw = [PackedOp(dw, {"x": P, "y": P}), PackedOp(pw, {"y": P, "z": P}, input_arg="y"),
              PackedOp(pw, {"z": P, "w": P}, input_arg="z")]
    assert {lay for op in resolve_packed_int8_conv2d(two_pw, "nvidia") for lay in op.layouts.values()} == {"4C"}
    tie = two_pw[:2]
    assert {lay for op in resolve_packed_int8_conv2d(tie, "nvidia") for lay in op.layouts.values()} == {"4C1W"}
    separate = [PackedOp(dw, {"x": P, "y": P}), PackedOp(pw, {"a": P, "b": P}, input_arg="a")]
    assert layouts_of(resolve_packed_int8_conv2d(separate, "nvidia")) == [
        {"x": "4C1W", "y": "4C1W"}, {"a": "4C", "b": "4C"}]


@pytest.mark.parametrize("family", GPU_FAMILIES)
@pytest.mark.parametrize(("target", "layout"), [
    ("etvk.q8ta_conv2d_im2col.default", "4C"), ("etvk.q8ta_conv2d_pw.default", "4C"),
    ("etvk.q8ta_conv2d_general.default", "4C1W"), ("etvk.q8ta_conv2d_dw.default", "4C1W"),
])
def test_single_algorithm_ops_want_their_layout_on_every_family(target, layout, family):
    ops = [PackedOp(target, {"x": P, "y": P})]
    assert layouts_of(resolve_packed_int8_conv2d(ops, family)) == [{"x": layout, "y": layout}]


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_rule4_and_fallback(family):
    ops = [
        PackedOp("etvk.add.default", {"a": P, "b": P}),  # reaches 4W4C through b and c
        PackedOp("etvk.mul.default", {"b": P, "c": P}),
        PackedOp("etvk.cat.default", {"c": "4W4C", "d": P}),
        PackedOp("etvk.neg.default", {"e": P, "f": P}),  # no concrete layout anywhere: 4C1W
        PackedOp("etvk.q8ta_conv2d_general.default", {"g": "4W4C", "h": P}, input_arg="g"),
    ]
    assert layouts_of(resolve_packed_int8_conv2d(ops, family)) == [
        {"a": "4W4C", "b": "4W4C"}, {"b": "4W4C", "c": "4W4C"}, {"c": "4W4C", "d": "4W4C"},
        {"e": "4C1W", "f": "4C1W"}, {"g": "4W4C", "h": "4W4C"}]


def test_first_conv_in_program_order_decides_a_shared_input():
    ops = [PackedOp("etvk.q8ta_conv2d_im2col.default", {"x": P, "y": P}),
           PackedOp("etvk.q8ta_conv2d_dw.default", {"x": P, "z": P})]
    assert layouts_of(resolve_packed_int8_conv2d(ops, "nvidia")) == [
        {"x": "4C", "y": "4C"}, {"x": "4C", "z": "4C"}]


@pytest.mark.parametrize("target", ["etvk.q8ta_conv2d_im2col", "etvk.q8ta_conv2d_im2col.default.x",
                                    "my.etvk.q8ta_conv2d_pw.default", "etvk.q8ta_conv2d_im2col_v2.default"])
def test_conv_ops_are_matched_by_exact_name(target):
    ops = [PackedOp(target, {"x": P})]
    assert layouts_of(resolve_packed_int8_conv2d(ops, "mali")) == [{"x": "4C1W"}]


def test_tuning_candidates_of_a_stem_include_the_im2col_gemms():
    assert candidate_algorithms(stem(1, 64, 7, 2, 3)) == ["im2col", "general", "im2col_coop"]
    assert candidate_algorithms(RULES["grouped_g2_cg6"][0]) == ["general"]


def test_resolver_follows_the_coop_route():
    """A stem the device runs on the implicit im2col wants 4C, the direct conv's 4C1W otherwise."""
    ops = [PackedOp("etvk.q8ta_quantize.default", {"q": P}),
           PackedOp("etvk.q8ta_conv2d.default", {"q": P, "a": P}, stem(1, 64, 7, 2, 3), "q")]
    assert layouts_of(resolve_packed_int8_conv2d(ops, "nvidia", coop=BOTH))[0] == {"q": "4C"}
    assert layouts_of(resolve_packed_int8_conv2d(ops, "nvidia"))[0] == {"q": "4C1W"}


def test_resolver_returns_new_ops_and_keeps_the_rest():
    ops = list(PROGRAM)
    resolved = resolve_packed_int8_conv2d(ops, "amd")
    assert ops == PROGRAM and all(lay == P for op in ops for lay in op.layouts.values())
    assert [(op.target, op.conv, op.input_arg) for op in resolved] == [
        (op.target, op.conv, op.input_arg) for op in PROGRAM]
    with pytest.raises(TypeError):
        resolved[0].layouts["q"] = "4C"  # layouts are read-only


@pytest.mark.parametrize(("ops", "text"), [
    ([PackedOp("a", {"x": "4C"}), PackedOp("b", {"x": "4C1W"})], "'x' is 4C in one op and 4C1W in b"),
    ([PackedOp("a", {"x": "4C", "y": P}), PackedOp("b", {"y": P, "z": "4C1W"})],
     "'x' and 'z' share a layout but are 4C in one op and 4C1W in b"),
    ([PackedOp("a", {"x": "NCHW"})], "a: 'x' has layout 'NCHW'"),
    ([PackedOp("etvk.q8ta_conv2d.default", {"x": P})], "the conv geometry is needed"),
    ([PackedOp("etvk.q8ta_conv2d_dw.default", {"in": P})], "input 'x' is not among its packed tensors"),
])
def test_resolver_rejects_bad_programs(ops, text):
    with pytest.raises(ValueError) as info:
        resolve_packed_int8_conv2d(ops, "intel")
    assert text in str(info.value)


# ---- weight formats: slow definitions --------------------------------------------------------


def as_bytes(words):
    return words.view(torch.int8).tolist()


def slow_gemm(w):
    c_out, cg, kh, kw = w.shape
    cg4 = -(-cg // 4) * 4  # each tap's channels padded to whole words
    o4, k4 = -(-c_out // 4), cg4 * kh * kw // 4
    out = [0] * (o4 * k4 * 16)
    for oc4, kk4, j, b in itertools.product(range(o4), range(k4), range(4), range(4)):
        oc, k = oc4 * 4 + j, kk4 * 4 + b
        tap, ic = divmod(k, cg4)
        if oc < c_out and ic < cg:
            out[((oc4 * k4 + kk4) * 4 + j) * 4 + b] = int(w[oc, ic, tap // kw, tap % kw])
    return out


def slow_direct(w, groups, c_in):
    c_out, cg, kh, kw = w.shape
    coutg, taps, o4 = c_out // groups, kh * kw, -(-c_out // 4)
    first = [(g * cg) // 4 for g in range(groups)]
    last = [((g + 1) * cg - 1) // 4 for g in range(groups)]
    nw = max(la - fi + 1 for fi, la in zip(first, last, strict=True))
    out = [0] * (o4 * taps * nw * 16)
    for oc4, tap, i, j, b in itertools.product(range(o4), range(taps), range(nw), range(4), range(4)):
        oc = oc4 * 4 + j
        if oc >= c_out:
            continue
        g = oc // coutg
        ch = (first[g] + i) * 4 + b
        if g * cg <= ch < (g + 1) * cg and i <= last[g] - first[g]:
            out[(((oc4 * taps + tap) * nw + i) * 4 + j) * 4 + b] = int(w[oc, ch - g * cg, tap // kw, tap % kw])
    return out, nw


def slow_depthwise(w):
    c, _, kh, kw = w.shape
    taps = kh * kw
    c4, t4 = -(-c // 4), -(-taps // 4)
    out = [0] * (c4 * t4 * 16)
    for cc4, tt4, j, b in itertools.product(range(c4), range(t4), range(4), range(4)):
        ch, tap = cc4 * 4 + j, tt4 * 4 + b
        if ch < c and tap < taps:
            out[((cc4 * t4 + tt4) * 4 + j) * 4 + b] = int(w[ch, 0, tap // kw, tap % kw])
    return out


# (C_out, Cg, KH, KW, groups)
WEIGHT_SHAPES = [(5, 3, 2, 3, 1), (9, 5, 3, 3, 3), (8, 4, 1, 1, 2), (10, 6, 3, 3, 2), (4, 7, 1, 2, 1),
                 (12, 2, 3, 1, 6), (6, 3, 3, 3, 3), (16, 8, 1, 1, 1), (8, 3, 7, 7, 1), (6, 1, 3, 3, 1),
                 (7, 6, 3, 3, 1), (8, 8, 3, 3, 2)]


def random_weights(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8)


@pytest.mark.parametrize("shape", WEIGHT_SHAPES, ids=str)
def test_gemm_and_direct_packing_follow_their_definitions(shape):
    *wshape, groups = shape
    w = random_weights(tuple(wshape), seed=sum(shape))
    if groups == 1 or wshape[1] % 4 == 0:
        gemm = pack_gemm_weights(w, groups)
        assert gemm.dtype == torch.int32 and as_bytes(gemm) == slow_gemm(w)
    else:  # no GEMM reads groups that straddle channel words
        with pytest.raises(ValueError, match=f"C_in/groups a multiple of 4, got {wshape[1]}"):
            pack_gemm_weights(w, groups)
    c_in = wshape[1] * groups
    direct, nw = pack_direct_weights(w, groups, c_in), direct_word_span(c_in, groups)
    want, want_nw = slow_direct(w, groups, c_in)
    assert direct.dtype == torch.int32 and (nw, as_bytes(direct)) == (want_nw, want)
    assert nw == direct_word_span(c_in, groups)


@pytest.mark.parametrize("shape", [(6, 1, 3, 3), (5, 1, 1, 5), (4, 1, 2, 2), (9, 1, 3, 3)], ids=str)
def test_depthwise_packing_follows_its_definition(shape):
    w = random_weights(shape, seed=sum(shape))
    packed = pack_depthwise_weights(w)
    assert packed.dtype == torch.int32 and as_bytes(packed) == slow_depthwise(w)


def test_weight_sums():
    w = random_weights((7, 3, 2, 2))
    assert weight_sums(w).dtype == torch.int32
    assert weight_sums(w).tolist() == [int(w[oc].to(torch.int64).sum()) for oc in range(7)]


def test_direct_word_span():
    assert [direct_word_span(c, g) for c, g in [(16, 1), (16, 2), (12, 2), (15, 3), (3, 1)]] == [4, 2, 2, 2, 1]


def test_packing_rejects_bad_weights():
    with pytest.raises(ValueError, match="int8"):
        pack_gemm_weights(torch.zeros(4, 4, 1, 1), 1)
    with pytest.raises(ValueError, match="C_in=10"):
        pack_direct_weights(random_weights((4, 4, 1, 1)), 2, 10)
    with pytest.raises(ValueError, match="one input channel per group"):
        pack_depthwise_weights(random_weights((4, 2, 3, 3)))


# ---- weight formats: plain-torch models of the shaders that read them ------------------------

SHADER_GEOMETRIES = [
    ((2, 8, 5, 7), (12, 8, 3, 3), [1], [1], [1], 1),
    ((1, 15, 6, 5), (9, 5, 3, 3), [2], [1], [1], 3),
    ((1, 12, 7, 9), (10, 6, 3, 2), [1, 2], [2, 1], [2, 1], 2),
    ((1, 6, 5, 9), (7, 6, 1, 1), [1], [0], [1], 1),
    ((1, 16, 4, 4), (8, 8, 1, 1), [1], [0], [1], 2),
    ((1, 3, 11, 9), (8, 3, 7, 7), [2], [3], [1], 1),
    ((2, 5, 7, 6), (6, 5, 3, 3), [2], [1], [1], 1),
    ((1, 1, 6, 7), (5, 1, 3, 3), [1], [1], [1], 1),
]


def taps(x, params, zero_point, junk=False):
    """x zero-point padded in space, padded to whole channel words (with random values where
    `junk`, else 0: whatever a writer left in the padding channels); one [N, C4*4, Ho, Wo] per tap."""
    (sy, sx), (dy, dx), (py, px) = params.stride, params.dilation, params.padding
    n, c, h, w = x.shape
    if junk:
        x = torch.cat([x, random_weights((n, -c % 4, h, w), 99)], 1)
    x = torch.nn.functional.pad(x.to(torch.int64), (px, px, py, py), value=zero_point)
    x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, -x.shape[1] % 4))
    return [x[:, :, ky * dy: ky * dy + sy * (params.H_out - 1) + 1: sy,
              kx * dx: kx * dx + sx * (params.W_out - 1) + 1: sx]
            for ky in range(params.KH) for kx in range(params.KW)]


def gemm_model(x, zp, packed, p):
    """im2col (K order: tap, then the group's channel words, padding channels holding junk) then
    a GEMM over each output channel's group."""
    kg4 = p.gemm_k // 4
    rows = packed.view(torch.int8).reshape(-1, kg4, 4, 4).permute(0, 2, 1, 3).reshape(-1, kg4 * 4)
    cols = torch.stack(taps(x, p, zp, junk=True), 1)[:, :, :p.groups * p.gemm_group_channels]
    cols = cols.reshape(p.N, p.taps, p.groups, p.gemm_group_channels, p.H_out, p.W_out).transpose(1, 2)
    cols = cols.reshape(p.N, p.groups, p.gemm_k, p.H_out, p.W_out)
    group = torch.arange(p.C_out) // p.Coutg
    return torch.einsum("nokhw,ok->nohw", cols[:, group], rows[:p.C_out].to(torch.int64))


def direct_model(x, zp, packed, nw, p):
    """Per output channel and tap: NW input channel words from its group's first word."""
    blocks = packed.view(torch.int8).reshape(-1, p.taps, nw, 4, 4).permute(0, 3, 1, 2, 4)
    weights = blocks.reshape(-1, p.taps, nw * 4)[:p.C_out].to(torch.int64)
    first = (torch.arange(p.C_out) // p.Coutg * p.Cg) // 4
    ch = (first[:, None] * 4 + torch.arange(nw * 4)).clamp(max=-(-p.C_in // 4) * 4 - 1)
    return sum(torch.einsum("nokhw,ok->nohw", patch[:, ch], weights[:, t])
               for t, patch in enumerate(taps(x, p, zp)))


@pytest.mark.parametrize("geometry", SHADER_GEOMETRIES, ids=str)
def test_gemm_and_direct_weights_give_the_reference_sums(geometry):
    x_shape, w_shape, *args = geometry
    p = conv2d_params(x_shape, w_shape, list(w_shape[2:]), *args)
    x, w = random_weights(x_shape, 1), random_weights(w_shape, 2)
    want = conv2d_accumulators(x, -7, w, p.stride, p.padding, p.dilation, p.groups)
    if p.im2col_eligible:  # the GEMMs serve only these
        assert torch.equal(gemm_model(x, -7, pack_gemm_weights(w, p.groups), p), want)
    assert torch.equal(direct_model(x, -7, pack_direct_weights(w, p.groups, p.C_in),
                                     direct_word_span(p.C_in, p.groups), p), want)


@pytest.mark.parametrize(("c", "k", "stride"), [(6, 3, 1), (144, 3, 2), (5, 5, 1)])
def test_depthwise_weights_give_the_reference_sums(c, k, stride):
    p = conv2d_params((1, c, 7, 9), (c, 1, k, k), [k], [stride], [k // 2], [1], c)
    x, w = random_weights((1, c, 7, 9), 3), random_weights((c, 1, k, k), 4)
    t4 = -(-p.taps // 4)
    rows = pack_depthwise_weights(w).view(torch.int8).reshape(-1, t4, 4, 4).permute(0, 2, 1, 3)
    rows = rows.reshape(-1, t4 * 4)[:c].to(torch.int64)
    got = sum(patch[:, :c] * rows[:, t].reshape(1, c, 1, 1) for t, patch in enumerate(taps(x, p, 5)))
    assert torch.equal(got, conv2d_accumulators(x, 5, w, p.stride, p.padding, p.dilation, c))


@pytest.mark.parametrize("m", [1, 4, 196, 3136, 100352])
@pytest.mark.parametrize("k4", [1, 31, 32, 128, 512, 1152])
@pytest.mark.parametrize("c_out", [1, 5, 32, 33, 256, 1280])
def test_gemm_tiling_covers_the_problem(m, k4, c_out):
    from runtime.families.conv2d_tiling import GEMM_WORKGROUP, gemm_tiling

    t = gemm_tiling(m, k4, c_out)
    rows = GEMM_WORKGROUP // t.split_k // t.threads_n
    assert rows * t.split_k * t.threads_n == GEMM_WORKGROUP
    assert t.split_k & (t.split_k - 1) == 0 and t.tile_m % 4 == 0
    gx, gy, gz = t.groups
    assert gz == 1
    assert (gx - 1) * t.tile_m * rows < m <= gx * t.tile_m * rows
    assert (gy - 1) * t.tile_n4 * t.threads_n < -(-c_out // 4) <= gy * t.tile_n4 * t.threads_n
