"""Int8 x int8 linear (`q8ta_linear`) on the default Vulkan device, validation on.

Every variant runs every case of `runtime.tools.examples_q8ta_linear`,
bit-exact against the reference (the contract: exact int32 sums, then the
fp32 epilogue in OPS.md family 2's order), and against PyTorch's decomposed
path (quantized_decomposed dequantize -> F.linear -> quantize_per_tensor):
int8 at most one step apart, fp32 within the rounding bound of PyTorch's fp32
sums. Inputs in each packed layout, plain device rows and host [N, K, 1, 1]
tensors flow through; quantize -> linear -> dequantize runs in one stream;
bad arguments name the op and the argument.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
import torch.nn.functional as F

import runtime
from runtime.errors import UnsupportedVariant
from runtime.families import q8ta_linear_weights
from runtime.reference import q8ta_linear as ref
from runtime.reference.quantize import dequantize_per_tensor, quantize_per_tensor
from runtime.tools.examples_q8ta_linear import CASES, CASES_BY_NAME, make_inputs
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_linear.default"
QD = torch.ops.quantized_decomposed
MIN_EXACT_VS_PYTORCH = 0.99
FP32_EPS = 2.0**-24


def inputs_for(variant: str, case, **kwargs):
    return make_inputs(case, fp32_output=variant.endswith("_float"), **kwargs)


def rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], x.shape[1])


def decomposed(inp) -> torch.Tensor:
    """PyTorch's reference path for a PT2E linear: dequantize, F.linear, quantize."""
    xf = QD.dequantize_per_tensor(rows(inp.x), inp.input_scale, inp.input_zero_point, -128, 127,
                                  torch.int8)
    zeros = torch.zeros(inp.weights.shape[0], dtype=torch.int64)
    wf = QD.dequantize_per_channel(inp.weights, inp.weight_scales, zeros, 0, -127, 127, torch.int8)
    y = F.linear(xf, wf, inp.bias)
    if inp.output_scale is None:
        return y
    return QD.quantize_per_tensor(y, inp.output_scale, inp.output_zero_point, -128, 127, torch.int8)


def fp32_bound(inp) -> torch.Tensor:
    """Bound on |ours - PyTorch's fp32 path|: both round each of about K + 4 operations
    on sums of at most Σ |x - zp| |w| s_in s_w + |bias|."""
    k = inp.x.shape[1]
    magnitude = ((rows(inp.x).double() - inp.input_zero_point).abs()
                 @ inp.weights.double().abs().T) * inp.input_scale * inp.weight_scales.double()
    if inp.bias is not None:
        magnitude = magnitude + inp.bias.double().abs()
    return (k + 4) * FP32_EPS * magnitude


def agreement(got: torch.Tensor, want: torch.Tensor) -> tuple[int, float]:
    """(elements exactly equal, largest difference)."""
    diff = (got.double() - want.double()).abs()
    return int((diff == 0).sum()), float(diff.max())


def _variant_cases():
    return [pytest.param(info.name, case, id=f"{info.name}-{case.name}")
            for info in runtime.get_op(OP).variants for case in CASES]


@pytest.mark.parametrize(("variant", "case"), _variant_cases())
def test_variant_matches_reference_bit_exactly(variant, case, dispatch_trace):
    inp = inputs_for(variant, case)
    got = runtime.get_op(OP)(*inp.args(), variant=variant)
    want = ref.q8ta_linear(*inp.args())
    assert got.dtype == want.dtype and got.shape == want.shape == (case.M, case.N_out)
    assert torch.equal(got, want), f"{variant} {case.name}: {agreement(got, want)}"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


def test_int8_agrees_with_pytorch_decomposed_within_one_step():
    exact = total = 0
    for case in CASES:
        inp = make_inputs(case)
        got = runtime.get_op(OP)(*inp.args())
        want = decomposed(inp)
        same, largest = agreement(got, want)
        assert largest <= 1, f"{case.name}: {largest} steps from PyTorch's decomposed path"
        exact, total = exact + same, total + want.numel()
    assert exact / total >= MIN_EXACT_VS_PYTORCH, f"only {exact}/{total} exact"


def test_fp32_agrees_with_pytorch_decomposed_within_rounding():
    for case in CASES:
        inp = make_inputs(case, fp32_output=True)
        got = runtime.get_op(OP)(*inp.args())
        diff = (got.double() - decomposed(inp).double()).abs()
        assert (diff <= fp32_bound(inp)).all(), f"{case.name}: max diff {diff.max().item():.3g}"


@pytest.mark.parametrize("fp32_output", [False, True], ids=["int8", "float"])
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_packed_device_input_is_read_in_place(layout, fp32_output):
    """A pooled [N, K, 1, 1] activation in any packed layout is read as N rows (no copy)."""
    for name in ("cifar_head_k37_n10", "tiles_m9_k130_n7", "resnet18_head"):
        inp = make_inputs(CASES_BY_NAME[name], fp32_output=fp32_output)
        x4 = inp.x.reshape(*inp.x.shape, 1, 1)
        with Stream() as stream:
            x = Tensor.from_torch(x4, layout=layout)
            out = runtime.get_op(OP).record(stream, x, *inp.args()[1:])
            stream.run()
            assert not out.packed
            assert torch.equal(out.to_torch(), ref.q8ta_linear(x4, *inp.args()[1:])), f"{layout} {name}"


@pytest.mark.parametrize("form", ["host_4d", "plain_device_2d", "plain_device_4d"])
def test_other_input_forms(form):
    inp = make_inputs(CASES_BY_NAME["cifar_head_k37_n10"])
    x = {
        "host_4d": inp.x.reshape(*inp.x.shape, 1, 1),
        "plain_device_2d": Tensor.from_torch(inp.x),
        "plain_device_4d": Tensor.from_torch(inp.x.reshape(*inp.x.shape, 1, 1)),
    }[form]
    got = runtime.get_op(OP)(x, *inp.args()[1:])
    assert torch.equal(got, ref.q8ta_linear(*inp.args()))


@pytest.mark.parametrize("case_name", ["cifar_head_k37_n10", "resnet18_head"])
def test_quantize_linear_dequantize_in_one_stream(case_name):
    """fp -> int8 (quantize_per_tensor) -> q8ta_linear -> fp (dequantize_per_tensor) on the device."""
    inp = make_inputs(CASES_BY_NAME[case_name])
    s, zp = inp.input_scale, inp.input_zero_point
    xf = (inp.x.float() - zp) * s + torch.randn(inp.x.shape, generator=torch.Generator().manual_seed(1)) * s
    quantize, dequantize = (runtime.get_op(f"etvk.{n}_per_tensor.default") for n in ("quantize", "dequantize"))
    with Stream() as stream:
        q = quantize.record(stream, xf, s, zp, -128, 127, torch.int8, storage="buffer")
        y = runtime.get_op(OP).record(stream, q, *inp.args()[1:])
        out = dequantize.record(stream, y, inp.output_scale, inp.output_zero_point, -128, 127,
                                torch.int8, storage="buffer")
        stream.run()
        got = out.to_torch()
    q_ref = quantize_per_tensor(xf, s, zp, -128, 127, torch.int8)
    y_ref = ref.q8ta_linear(q_ref, *inp.args()[1:])
    want = dequantize_per_tensor(y_ref, inp.output_scale, inp.output_zero_point, -128, 127, torch.int8)
    assert torch.equal(got, want)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_pooled_packed_activation_chain(layout):
    """q8ta_quantize (packed [N, K, 1, 1]) -> q8ta_linear (fp32 logits) in one stream."""
    inp = make_inputs(CASES_BY_NAME["tiles_m9_k130_n7"], fp32_output=True)
    xf = ((inp.x.float() - inp.input_zero_point) * inp.input_scale).reshape(*inp.x.shape, 1, 1)
    with Stream() as stream:
        q = runtime.get_op("etvk.q8ta_quantize.default").record(
            stream, xf, inp.input_scale, inp.input_zero_point, layout)
        out = runtime.get_op(OP).record(stream, q, *inp.args()[1:])
        stream.run()
        assert torch.equal(out.to_torch(), ref.q8ta_linear(*inp.args()))


def test_prepacking_happens_once_per_weight(monkeypatch):
    calls = []
    real = q8ta_linear_weights.pack_q8ta_linear_weights
    monkeypatch.setattr(q8ta_linear_weights, "pack_q8ta_linear_weights",
                        lambda *a: calls.append(1) or real(*a))
    inp = make_inputs(CASES_BY_NAME["rows32_k64_n12"])
    op = runtime.get_op(OP)
    first = op(*inp.args())
    assert torch.equal(op(*inp.args()), first)
    assert len(calls) == 1
    inp.weights.add_(0)  # an in-place change (a new version) repacks
    op(*inp.args())
    assert len(calls) == 2


def test_packed_weights_layout():
    w = torch.arange(-60, 60, dtype=torch.int8).reshape(6, 20)[:5, :7].contiguous()  # N_out 5, K 7
    words = q8ta_linear_weights.pack_q8ta_linear_weights(w).view(torch.int8).reshape(2, 2, 4, 4)
    for n in range(8):
        for k in range(8):
            want = int(w[n, k]) if n < 5 and k < 7 else 0
            assert int(words[n // 4, k // 4, n % 4, k % 4]) == want, (n, k)


BASE = "cifar_head_k37_n10"
BAD_ARGS = [
    ({"x": torch.zeros(3, 37)}, "x", "int8"),
    ({"x": torch.zeros(1, 3, 37, dtype=torch.int8)}, "x", "[N, K, 1, 1]"),
    ({"x": torch.zeros(3, 37, 2, 1, dtype=torch.int8)}, "x", "[N, K, 1, 1]"),
    ({"x": torch.zeros(0, 37, dtype=torch.int8)}, "x", "M, K >= 1"),
    ({"weights": torch.zeros(10, 36, dtype=torch.int8)}, "weights", "K=36 input features, but x has K=37"),
    ({"x": torch.zeros(1, 65537, dtype=torch.int8), "weights": torch.zeros(10, 65537, dtype=torch.int8)},
     "x", "at most 65536"),
    ({"weights": torch.zeros(10, 37)}, "weights", "int8 [N_out, K]"),
    ({"weights": torch.zeros(10, 37, 1, 1, dtype=torch.int8)}, "weights", "int8 [N_out, K]"),
    ({"weight_sums": torch.zeros(9, dtype=torch.int32)}, "weight_sums", "one value per output channel (10)"),
    ({"weight_sums": torch.full((10,), 0.5)}, "weight_sums", "int32"),
    ({"weight_scales": torch.ones(11)}, "weight_scales", "(10)"),
    ({"weight_scales": -torch.ones(10)}, "weight_scales", "> 0"),
    ({"weight_scales": torch.full((10,), float("nan"))}, "weight_scales", "finite"),
    ({"bias": torch.zeros(3)}, "bias", "(10)"),
    ({"bias": torch.zeros(10, dtype=torch.int32)}, "bias", "fp32 [N_out]"),
    ({"input_scale": 0.0}, "input_scale", "> 0"),
    ({"input_scale": float("inf")}, "input_scale", "finite"),
    ({"input_scale": "0.1"}, "input_scale", "expected a float"),
    ({"output_scale": -1.0}, "output_scale", "> 0"),
    ({"output_scale": float("nan")}, "output_scale", "finite"),
    ({"input_zero_point": 128}, "input_zero_point", "int8"),
    ({"output_zero_point": -129}, "output_zero_point", "int8"),
]


@pytest.mark.parametrize(("changes", "arg", "text"), BAD_ARGS, ids=[f"{a}-{t}" for _, a, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(changes, arg, text):
    inp = dataclasses.replace(make_inputs(CASES_BY_NAME[BASE]), **changes)
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(OP)(*inp.args())
    message = str(info.value)
    assert message.startswith(f"{OP}: argument '{arg}'"), message
    assert text in message, message


def test_texture_device_input_is_refused():
    inp = make_inputs(CASES_BY_NAME[BASE])
    x = Tensor.from_torch(inp.x, storage="texture3d")
    with pytest.raises(ValueError, match=f"^{OP}: argument 'x'.*buffer tensor"):
        runtime.get_op(OP)(x, *inp.args()[1:])


def test_forcing_the_other_output_dtype_is_refused():
    inp = make_inputs(CASES_BY_NAME[BASE])
    with pytest.raises(UnsupportedVariant, match="output_scale"):
        runtime.get_op(OP)(*inp.args(), variant="q8ta_linear_fallback_float")
