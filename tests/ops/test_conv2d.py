"""Int8 conv2d family (OPS.md family 2) on the default Vulkan device, validation on.

Every variant of every conv op runs the layer table of
`runtime.tools.examples_conv2d` that its op accepts, against the OPS.md fp32
reference (bit-exact) and against PyTorch (at most one step, at least 99.5 %
exact: QNNPACK's quantized conv, or the decomposed fp32 path for hardswish).
Device inputs in each packed layout check that layouts flow through; the
dispatcher is checked for every GPU family; bad arguments name the op and
the argument. test_conv2d_activations.py runs every activation on every
variant.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conv_testlib import (
    MIN_EXACT,
    assert_bit_exact,
    packed_bytes,
    pytorch_conv2d,
    steps_apart,
    variant_args,
)

import runtime
from runtime.errors import UnsupportedVariant
from runtime.families import conv2d as conv2d_module
from runtime.reference import conv2d as ref
from runtime.tools.examples_conv2d import CASES, CASES_BY_NAME, make_inputs
from runtime.vulkan.device import GPU_FAMILIES, get_device
from runtime.vulkan.layouts import PACKED_LAYOUTS, pack, packed_words
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

CONV_OPS = {
    "im2col": "etvk.q8ta_conv2d_im2col.default",
    "general": "etvk.q8ta_conv2d_general.default",
    "pw": "etvk.q8ta_conv2d_pw.default",
    "dw": "etvk.q8ta_conv2d_dw.default",
}


def accepts(kind: str, case) -> bool:
    """Whether the op of `kind` takes this case (the others reject it by design)."""
    p = case.params
    return {
        "im2col": p.im2col_eligible,
        "general": True,
        "pw": p.is_pointwise,
        "dw": p.is_depthwise,
    }[kind]


def _variant_cases():
    params = []
    for kind, op_name in CONV_OPS.items():
        for info in runtime.get_op(op_name).variants:
            for case in CASES:
                if accepts(kind, case):
                    params.append(pytest.param(op_name, info.name, case,
                                               id=f"{info.name}-{case.name}"))
    return params


@pytest.mark.parametrize(("op_name", "variant", "case"), _variant_cases())
def test_variant_matches_reference_and_pytorch(op_name, variant, case, dispatch_trace):
    op = runtime.get_op(op_name)
    inp = make_inputs(case)
    got = op(*variant_args(inp, variant), variant=variant)
    assert_bit_exact(got, ref.q8ta_conv2d(*inp.args()), f"{variant} {case.name} vs reference")
    exact = steps_apart(got, pytorch_conv2d(inp), f"{variant} {case.name} vs PyTorch")
    assert exact >= MIN_EXACT, f"{variant} {case.name}: only {exact:.4%} equal PyTorch's"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize(("kind", "case_name"), [
    ("general", "resnet_bottleneck_3x3"), ("im2col", "resnet_bottleneck_3x3"),
    ("pw", "resnet_bottleneck_1x1_reduce"), ("general", "resnet_bottleneck_1x1_reduce")])
def test_large_accumulators_convert_exactly(kind, case_name):
    """Sums far from zero: acc - input_zero_point * weight_sums up to 255 * 127 * K (above 2^22,
    and above 2^24 where fp32 rounds the sum), around 2^22 and small, beside each other in one
    output word, converted as the reference does, in every variant, bit-exact."""
    op = runtime.get_op(CONV_OPS[kind])
    inp = make_inputs(CASES_BY_NAME[case_name])
    gen = torch.Generator().manual_seed(22)
    c_out, k = inp.weights.shape[0], inp.weights[0].numel()
    # x - input_zero_point = 255 everywhere; output channel oc's weights are 127 in its first
    # oc * K // C_out taps and random after, so |sum| runs from ~2^15 to 255 * 127 * K.
    x = torch.full_like(inp.x, 127)
    w = torch.randint(-127, 128, inp.weights.shape, generator=gen, dtype=torch.int8).view(c_out, k)
    for oc in range(c_out):
        w[oc, : oc * k // c_out] = 127
    w = w.view(inp.weights.shape)
    big = 255.0 * 127 * k * inp.input_scale * float(inp.weight_scales.max())
    inp = dataclasses.replace(inp, x=x, input_zero_point=-128, weights=w,
                              weight_sums=conv2d_module.weight_sums(w),
                              output_scale=big / 200, output_zero_point=-60)
    assert 255 * 127 * k > 1 << 22
    want = ref.q8ta_conv2d(*inp.args())
    assert len(set(want.flatten().tolist())) > 30, "the outputs do not spread over the range"
    for info in op.variants:
        assert_bit_exact(op(*variant_args(inp, info.name), variant=info.name), want, f"{info.name} {case_name}")


@pytest.mark.parametrize(("kind", "case_name", "fixed"), [
    ("general", "resnet50_stem_7x7s2", {"FIXED_KW": 7, "FIXED_KH": 7, "FIXED_NW": 1}),
    ("general", "alexnet_stem_11x11s4", {"FIXED_KW": 0, "FIXED_KH": 0, "FIXED_NW": 1}),
    ("general", "asym_1x7_pad_0_3", {"FIXED_KW": 7, "FIXED_KH": 1, "FIXED_NW": 2}),
    ("general", "resnet_bottleneck_1x1_reduce", {"FIXED_KW": 1, "FIXED_KH": 1, "FIXED_NW": 0}),
    ("dw", "mobilenetv3_dw_5x5s2", {"FIXED_KW": 5, "FIXED_KH": 5}),
    ("dw", "dw_9x9", {"FIXED_KW": 0, "FIXED_KH": 0}),
])
def test_loop_bounds_are_spec_constants_up_to_7x7(kind, case_name, fixed, monkeypatch):
    """The direct and depthwise convs get KW, KH (kernels up to 7x7) and the direct conv's
    channel words per tap (up to 16) as spec constants, for the driver to unroll their loops;
    above, 0: the shader reads them from the push constants (both paths: the CASES)."""
    seen = []
    real = Stream.dispatch

    def spy(self, kernel, op, **kw):
        seen.append(kw["spec_constants"])
        return real(self, kernel, op, **kw)

    monkeypatch.setattr(Stream, "dispatch", spy)
    inp = make_inputs(CASES_BY_NAME[case_name])
    with Stream() as stream:  # recorded afresh: an eager call could replay an earlier call's plan
        out = runtime.get_op(CONV_OPS[kind]).record(stream, *inp.args())
        stream.run()
        assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args()), case_name)
    assert len(seen) == 1 and {k: seen[0][k] for k in fixed} == fixed


LAYOUT_CASES = ["grouped_g2_cg8", "strided_3x3s2_w13_cout12", "mobilenetv2_dw_c30_w13",
                "pointwise_cin6_cout7", "batch2_3x3_cout10"]


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("kind", list(CONV_OPS))
def test_device_input_layouts_flow_through(kind, layout):
    """A device input in any packed layout is read in place; the output keeps its layout."""
    op = runtime.get_op(CONV_OPS[kind])
    cases = [CASES_BY_NAME[name] for name in LAYOUT_CASES if accepts(kind, CASES_BY_NAME[name])]
    assert cases
    for case in cases:
        inp = make_inputs(case)
        with Stream() as stream:
            x = Tensor.from_torch(inp.x, layout=layout)
            out = op.record(stream, x, *inp.args()[1:])
            stream.run()
            assert out.layout == layout
            assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args()),
                             f"{kind} {layout} {case.name}")


def trace_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_dispatcher_follows_the_family_rule(family, monkeypatch, dispatch_trace_path):
    device = get_device()
    monkeypatch.setattr(device, "caps", dataclasses.replace(device.caps, family=family))
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    shaders = {"pw": "q8ta_gemm", "dw": "q8ta_conv2d_dw", "im2col": "q8ta_im2col",
               "general": "q8ta_conv2d_direct"}
    for name in ("resnet_bottleneck_3x3", "mobilenetv2_dw_3x3s1", "mobilenetv2_expand_1x1",
                 "grouped_g2_cg8", "wide_c4_70x70", "grouped_g3_cg5_cout9"):
        case = CASES_BY_NAME[name]
        inp = make_inputs(case)
        expected = conv2d_module.choose_algorithm(case.params, family)
        before = len(trace_lines(dispatch_trace_path))
        assert_bit_exact(op(*inp.args()), ref.q8ta_conv2d(*inp.args()), f"{family} {name}")
        ran = [line["variant"] for line in trace_lines(dispatch_trace_path)[before:]]
        assert ran and ran[0].startswith(shaders[expected]), f"{family} {name}: ran {ran}"


def test_prepacking_happens_once_per_weight(monkeypatch):
    calls = []
    real = conv2d_module.pack_gemm_weights
    monkeypatch.setattr(conv2d_module, "pack_gemm_weights",
                        lambda *a: calls.append(1) or real(*a))
    op = runtime.get_op("etvk.q8ta_conv2d_im2col.default")
    inp = make_inputs(CASES_BY_NAME["grouped_g2_cg8"])
    first = op(*inp.args())
    assert torch.equal(op(*inp.args()), first)
    assert len(calls) == 1
    inp.weights.add_(0)  # an in-place change (a new version) repacks
    op(*inp.args())
    assert len(calls) == 2


def test_quantize_conv_dequantize_in_one_stream():
    """fp -> packed int8 -> conv -> conv -> fp recorded once, with no host round trip."""
    case = CASES_BY_NAME["resnet_bottleneck_3x3"]
    inp = make_inputs(case)
    x = (inp.x.float() - inp.input_zero_point) * inp.input_scale
    q = runtime.get_op("etvk.q8ta_quantize.default")
    conv = runtime.get_op("etvk.q8ta_conv2d.default")
    dq = runtime.get_op("etvk.q8ta_dequantize.default")
    with Stream() as stream:
        packed = q.record(stream, x, inp.input_scale, inp.input_zero_point)
        y = conv.record(stream, packed, *inp.args()[1:])
        z = conv.record(stream, y, inp.output_scale, inp.output_zero_point, *inp.args()[3:])
        out = dq.record(stream, z, inp.output_scale, inp.output_zero_point)
        stream.run()
        got = out.to_torch()
    y_ref = ref.q8ta_conv2d(*inp.args())
    z_ref = ref.q8ta_conv2d(y_ref, inp.output_scale, inp.output_zero_point, *inp.args()[3:])
    want = ref.q8ta_dequantize(z_ref, inp.output_scale, inp.output_zero_point, "4C1W")
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_q8ta_quantize_dequantize_every_variant_and_layout(layout, storage, dtype,
                                                           dispatch_trace_path):
    """Each variant (storage x fp dtype) with each value of its spec constant LAYOUT: the
    packed words, padding bytes included (written over a dirty buffer), and the values back,
    through a device tensor and through host round trips."""
    gen = torch.Generator().manual_seed(7)
    q, dq = runtime.get_op("etvk.q8ta_quantize.default"), runtime.get_op("etvk.q8ta_dequantize.default")
    short = {torch.float32: "float", torch.float16: "half"}[dtype]
    for shape in [(1, 1, 1, 1), (1, 6, 3, 5), (2, 13, 4, 9), (1, 4, 2, 8)]:
        x = (torch.randn(shape, generator=gen) * 3).to(dtype)
        want = ref.q8ta_quantize(x, 0.0371, -5, layout)
        want_back = ref.q8ta_dequantize(want, 0.0371, -5, layout, out_dtype=dtype)
        device_x = Tensor.from_torch(x, storage)
        spare = Tensor.empty(shape, torch.int8, layout=layout)  # full of 0xFF, recycled by `packed`
        junk = torch.full((4 * packed_words(shape, layout),), -1, dtype=torch.int8)
        spare.memory.write(junk.data_ptr(), junk.numel())
        del spare
        before = len(trace_lines(dispatch_trace_path))
        with Stream() as stream:
            packed = q.record(stream, device_x, 0.0371, -5, layout, storage=storage)
            back = dq.record(stream, packed, 0.0371, -5, out_dtype=dtype, storage=storage)
            stream.run()
            assert packed.layout == layout
            assert torch.equal(packed_bytes(packed), pack(want, layout)), f"{shape}"
            assert torch.equal(back.to_torch(), want_back), f"{shape}"
        ran = [line["variant"] for line in trace_lines(dispatch_trace_path)[before:]]
        assert ran == [f"q8ta_quantize_{storage}_{short}", f"q8ta_dequantize_{storage}_{short}"]
        assert torch.equal(q(x, 0.0371, -5, layout, storage=storage), want), f"{shape}"
        assert torch.equal(dq(want, 0.0371, -5, layout, out_dtype=dtype, storage=storage),
                           want_back), f"{shape}"


BAD_ARGS = [
    ("im2col", "grouped_g2_cg6_cout10", {}, "groups", "multiple of 4"),
    ("pw", "resnet_bottleneck_3x3", {}, "kernel_size", "1x1"),
    ("pw", "resnet_downsample_1x1s2", {}, "kernel_size", "stride 1"),
    ("dw", "grouped_g2_cg8", {}, "groups", "groups == C_in == C_out"),
    ("general", "grouped_g2_cg8", {"stride": [0, 1]}, "stride", "> 0"),
    ("general", "grouped_g2_cg8", {"dilation": [1, -1]}, "dilation", "> 0"),
    ("general", "grouped_g2_cg8", {"padding": [-1]}, "padding", ">= 0"),
    ("general", "large_pad_5x5_pad4", {"padding": [0, 0], "dilation": [2, 2]}, "kernel_size",
     "padded input"),
    ("general", "grouped_g2_cg8", {"kernel_size": [3, 1]}, "kernel_size", "equal to the weights"),
    ("general", "grouped_g2_cg8", {"weight_sums": torch.zeros(5, dtype=torch.int32)},
     "weight_sums", "one int32 value per output channel (16)"),
    ("general", "grouped_g2_cg8", {"weight_scales": torch.ones(15)}, "weight_scales", "(16)"),
    ("general", "grouped_g2_cg8", {"weight_scales": -torch.ones(16)}, "weight_scales", "> 0"),
    ("general", "grouped_g2_cg8", {"bias": torch.zeros(3)}, "bias", "(16)"),
    ("general", "grouped_g2_cg8", {"activation": "relu6"}, "activation",
     "one of 'none', 'relu', 'hardtanh', 'hardswish'"),
    ("general", "grouped_g2_cg8", {"groups": 3}, "groups", "divide C_in=16"),
    ("general", "grouped_g2_cg8", {"input_scale": 0.0}, "input_scale", "> 0"),
    ("general", "grouped_g2_cg8", {"output_zero_point": 200}, "output_zero_point", "int8"),
    ("general", "grouped_g2_cg8", {"x": torch.zeros(1, 16, 10, 10)}, "x", "int8"),
    ("general", "grouped_g2_cg8", {"weights": torch.zeros(16, 8, 3, 3)}, "weights", "int8"),
    ("im2col", "grouped_g2_cg8", {"activation": None}, "activation", "expected a str"),
]


@pytest.mark.parametrize(("kind", "case_name", "changes", "arg", "text"), BAD_ARGS,
                         ids=[f"{k}-{a}-{t}" for k, _, _, a, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(kind, case_name, changes, arg, text):
    op = runtime.get_op(CONV_OPS[kind])
    inp = dataclasses.replace(make_inputs(CASES_BY_NAME[case_name]), **changes)
    with pytest.raises((ValueError, TypeError)) as info:
        op(*inp.args())
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message


def test_forcing_a_variant_of_another_route_is_refused():
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    inp = make_inputs(CASES_BY_NAME["mobilenetv2_dw_3x3s1"])
    with pytest.raises(UnsupportedVariant, match="q8ta_conv2d_dw"):
        op(*inp.args(), variant="q8ta_conv2d_direct_fallback")
