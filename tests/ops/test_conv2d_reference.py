"""The int8 conv2d reference (OPS.md family 2) against PyTorch and against itself.

- against PyTorch's quantized conv on the QNNPACK engine (hardswish, which
  QNNPACK cannot fuse: against PyTorch's decomposed fp32 path), per-channel
  and per-tensor weights: at most one step apart and at least 99.5 % exact
  per case (QNNPACK folds the scales into one fp32 multiplier and quantizes
  the bias to int32, so values near a rounding tie may land one step away);
- the integer part against an independent int64 tap-by-tap sum (bit-exact);
- the fp32 epilogue against the same formula in float64 (one step);
- q8ta_quantize / q8ta_dequantize bit-identical to quantized_decomposed.

Cases come from the table in runtime/tools/examples_conv2d.py. No Vulkan.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conv_testlib import MIN_EXACT, pytorch_conv2d, qnnpack_conv2d, steps_apart

from runtime.families.conv2d import Conv2dParams, conv2d_params
from runtime.reference import conv2d as ref
from runtime.tools.examples_conv2d import CASES, Conv2dCase, Conv2dInputs, make_inputs
from runtime.vulkan.layouts import PACKED_LAYOUTS

_IDS = [case.name for case in CASES]


def test_case_table_is_small_and_named_uniquely():
    assert len({case.name for case in CASES}) == len(CASES)
    for case in CASES:
        assert case.macs <= 2_000_000, f"{case.name}: {case.macs} MACs"
        assert case.real, case.name


def test_outputs_spread_over_the_int8_range():
    """The chosen scales give varied outputs: few saturated, many distinct values."""
    for case in CASES:
        out = ref.q8ta_conv2d(*make_inputs(case).args())
        saturated = ((out == 127) | (out == -128)).double().mean().item()
        assert saturated < 0.05, f"{case.name}: {saturated:.2%} saturated"
        assert out.unique().numel() >= min(50, out.numel() // 4), case.name


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_reference_matches_pytorch_per_channel(case: Conv2dCase):
    inp = make_inputs(case)
    exact = steps_apart(ref.q8ta_conv2d(*inp.args()), pytorch_conv2d(inp), case.name)
    assert exact >= MIN_EXACT, f"{case.name}: only {exact:.4%} equal PyTorch's"


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_reference_matches_pytorch_per_tensor(case: Conv2dCase):
    inp = make_inputs(case, per_tensor_weights=True)
    exact = steps_apart(ref.q8ta_conv2d(*inp.args()), pytorch_conv2d(inp, per_channel=False),
                        case.name)
    assert exact >= MIN_EXACT, f"{case.name}: only {exact:.4%} equal PyTorch's"


def test_reference_matches_qnnpack_over_all_cases():
    """Over every case QNNPACK fuses together, at least 99.9 % of the outputs equal QNNPACK's."""
    total = exact = 0
    for case in CASES:
        if case.activation == "hardswish":
            continue
        inp = make_inputs(case)
        out = ref.q8ta_conv2d(*inp.args())
        total += out.numel()
        exact += out.numel() * steps_apart(out, qnnpack_conv2d(inp), case.name)
    assert exact / total >= 0.999, f"{exact / total:.5%} of {total} outputs equal PyTorch's"


def tap_by_tap_accumulators(inp: Conv2dInputs) -> torch.Tensor:
    """Σ x*w in int64, one kernel tap at a time, groups by einsum: an independent integer path."""
    p = make_params(inp)
    (sy, sx), (dy, dx), (py, px) = p.stride, p.dilation, p.padding
    x = torch.nn.functional.pad(inp.x.to(torch.int64), (px, px, py, py), value=inp.input_zero_point)
    w = inp.weights.to(torch.int64).reshape(p.groups, p.Coutg, p.Cg, p.KH, p.KW)
    acc = torch.zeros(p.N, p.groups, p.Coutg, p.H_out, p.W_out, dtype=torch.int64)
    for ky in range(p.KH):
        for kx in range(p.KW):
            rows = slice(ky * dy, ky * dy + sy * (p.H_out - 1) + 1, sy)
            cols = slice(kx * dx, kx * dx + sx * (p.W_out - 1) + 1, sx)
            patch = x[:, :, rows, cols].reshape(p.N, p.groups, p.Cg, p.H_out, p.W_out)
            acc += torch.einsum("ngchw,goc->ngohw", patch, w[..., ky, kx])
    return acc.reshape(p.N, p.C_out, p.H_out, p.W_out)


def make_params(inp: Conv2dInputs) -> Conv2dParams:
    return conv2d_params(inp.x.shape, inp.weights.shape, inp.kernel_size, inp.stride,
                         inp.padding, inp.dilation, inp.groups)


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_integer_part_is_exact(case: Conv2dCase):
    inp = make_inputs(case)
    p = make_params(inp)
    acc = ref.conv2d_accumulators(inp.x, inp.input_zero_point, inp.weights, p.stride, p.padding,
                                  p.dilation, p.groups)
    want = tap_by_tap_accumulators(inp)
    assert torch.equal(acc, want)
    requantized = ref.requantize(want, inp.input_scale, inp.input_zero_point, inp.weight_sums,
                                 inp.weight_scales, inp.output_scale, inp.output_zero_point,
                                 inp.bias, inp.activation, inp.activation_min, inp.activation_max)
    assert torch.equal(ref.q8ta_conv2d(*inp.args()), requantized)


def float64_formula(inp: Conv2dInputs) -> torch.Tensor:
    """OPS.md's epilogue in float64 (the real-number value, rounded once at each step)."""
    acc = tap_by_tap_accumulators(inp)
    sums = inp.weight_sums.to(torch.int64).reshape(1, -1, 1, 1)
    scales = (inp.input_scale * inp.weight_scales.double()).reshape(1, -1, 1, 1)
    y = (acc - inp.input_zero_point * sums).double() * scales
    if inp.bias is not None:
        y = y + inp.bias.double().reshape(1, -1, 1, 1)
    if inp.activation == "relu":
        y = y.clamp_min(0)
    elif inp.activation == "hardtanh":
        y = y.clamp(inp.activation_min, inp.activation_max)
    elif inp.activation == "hardswish":
        y = y * (y + 3).clamp(0, 6) / 6
    q = torch.round(y / inp.output_scale) + inp.output_zero_point
    return q.clamp(-128, 127).to(torch.int8)


@pytest.mark.parametrize("case", CASES, ids=_IDS)
def test_fp32_epilogue_within_one_step_of_float64(case: Conv2dCase):
    inp = make_inputs(case)
    exact = steps_apart(ref.q8ta_conv2d(*inp.args()), float64_formula(inp), case.name)
    assert exact >= MIN_EXACT, f"{case.name}: only {exact:.4%} equal the float64 formula"


def test_relu_clamps_at_the_output_zero_point():
    case = next(c for c in CASES if c.activation == "relu")
    inp = make_inputs(case)
    out = ref.q8ta_conv2d(*inp.args())
    assert out.min().item() == inp.output_zero_point
    linear = ref.q8ta_conv2d(*dataclasses.replace(inp, activation="none").args())
    assert torch.equal(out, linear.clamp_min(inp.output_zero_point))


def test_scalar_kernel_arguments_as_single_item_lists():
    case = next(c for c in CASES if c.name == "resnet_bottleneck_3x3")
    inp = make_inputs(case)
    args = list(inp.args())
    args[9:13] = [[3], [1], [1], [1]]
    assert torch.equal(ref.q8ta_conv2d(*args), ref.q8ta_conv2d(*inp.args()))


def test_bad_activation_and_kernel_size_are_rejected():
    inp = make_inputs(next(c for c in CASES if c.name == "resnet50_stem_7x7s2"))
    with pytest.raises(ValueError, match="activation 'relu6'"):
        ref.q8ta_conv2d(*dataclasses.replace(inp, activation="relu6").args())
    args = list(inp.args())
    args[9] = [3, 3]
    with pytest.raises(ValueError, match="does not match the weights' 7x7"):
        ref.q8ta_conv2d(*args)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_q8ta_quantize_and_dequantize_are_bit_identical_to_pytorch(layout):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 3, 7, generator=gen) * 3
    x.view(-1)[:20] = (torch.arange(20) - 10 + 0.5) * 0.0371  # rounding ties
    q = ref.q8ta_quantize(x, 0.0371, -3, layout)
    want = torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.0371, -3, -128, 127, torch.int8)
    assert q.dtype == torch.int8 and torch.equal(q, want)
    for out_dtype in (None, torch.float16):
        got = ref.q8ta_dequantize(q, 0.0371, -3, layout, out_dtype=out_dtype)
        want = torch.ops.quantized_decomposed.dequantize_per_tensor(
            q, 0.0371, -3, -128, 127, torch.int8, out_dtype=out_dtype)
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_q8ta_quantize_rejects_unknown_layouts_and_ranks():
    with pytest.raises(ValueError, match="layout '4W' is not a packed int8 layout"):
        ref.q8ta_quantize(torch.zeros(1, 4, 2, 2), 0.1, 0, "4W")
    with pytest.raises(ValueError, match="layout 'PACKED_INT8_CONV2D' is not"):
        ref.q8ta_dequantize(torch.zeros(1, 4, 2, 2, dtype=torch.int8), 0.1, 0, "PACKED_INT8_CONV2D")
    with pytest.raises(ValueError, match="must be a 4-D"):
        ref.q8ta_quantize(torch.zeros(4, 2, 2), 0.1, 0, "4C")
