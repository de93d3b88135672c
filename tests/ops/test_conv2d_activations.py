"""Conv activations (relu, hardtanh / ReLU6, hardswish) on every int8 conv variant.

- relu and hardtanh are an int8 clamp by host-quantized bounds: the identity
  with clamping the fp32 conv output first, over many random scales, zero
  points, bounds and values at the edges;
- hardswish's fp32 evaluation order, step by step, and how far it is from
  PyTorch's (which divides by 6);
- every variant of every conv op (algorithm x DOT x input layout) with every
  activation, bit-exact against the reference; the dispatcher passes the
  activation through each of its routes;
- the reference against PyTorch for ReLU6 (QNNPACK and the decomposed fp32
  path) and hardswish (decomposed path): at most one step; a hardtanh after a
  requantize with the same qparams (PT2E's ReLU6 pattern) folds exactly;
- bad activation arguments name the op and the argument.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conv_testlib import (
    CONV_OPS,
    MIN_EXACT,
    TINY,
    assert_bit_exact,
    decomposed_conv2d,
    qnnpack_conv2d,
    routed_cases,
    steps_apart,
    variant_layouts,
)

import runtime
from runtime.families.conv2d import ACTIVATIONS, conv2d_output_bounds
from runtime.reference import conv2d as ref
from runtime.reference.quantize import quantize_per_tensor
from runtime.tools.examples_conv2d import CASES, CASES_BY_NAME, make_inputs
from runtime.vulkan.device import get_device
from runtime.vulkan.tensor import Tensor

# name -> (activation, activation_min, activation_max)
SETTINGS = {
    "none": ("none", 0.0, 6.0),
    "relu": ("relu", 0.0, 6.0),
    "relu6": ("hardtanh", 0.0, 6.0),
    "hardtanh_m1_2": ("hardtanh", -1.0, 2.0),
    "hardswish": ("hardswish", 0.0, 6.0),
}


def quantize(y: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """The epilogue's quantize: clamp(roundEven(y * fp32(1/scale)) + zp, -128, 127)."""
    return quantize_per_tensor(y, scale, zero_point, -128, 127, torch.int8)


def inputs(case_name: str, setting: str):
    """The case's arguments with the setting's activation (output qparams to match)."""
    activation, lo, hi = SETTINGS[setting]
    case = dataclasses.replace(CASES_BY_NAME[case_name], activation=activation,
                               activation_min=lo, activation_max=hi)
    return make_inputs(case)


# ---------------------------------------------------------------- numerics (host)


def _edge_values(lo: float, hi: float, scale: float, zp: int, gen) -> torch.Tensor:
    """fp32 values around the bounds, their quantization midpoints and at random."""
    inv = 1.0 / scale
    points = [lo, hi, 0.0]
    for bound in (lo, hi):
        k = round(bound * inv)
        points += [(k + d + 0.5) * scale for d in (-2, -1, 0, 1)]
    base = torch.tensor(points, dtype=torch.float32)
    up, down = torch.full_like(base, float("inf")), torch.full_like(base, -float("inf"))
    neighbours = torch.cat([base, torch.nextafter(base, up), torch.nextafter(base, down)])
    spread = max(abs(lo), abs(hi), 200 * scale)
    rand = (torch.rand(256, generator=gen, dtype=torch.float64) * 2 - 1) * 1.5 * spread
    return torch.cat([neighbours, rand.to(torch.float32)])


def test_relu_and_hardtanh_clamp_equals_clamping_before_quantizing():
    """quantize(clamp(y, a, b)) == clamp(quantize(y), quantize(a), quantize(b)), exactly.

    The samples are sharp enough that the naive bounds round(a / scale) + zp
    (float64 division) differ somewhere: the test can tell the formulas apart.
    """
    gen = torch.Generator().manual_seed(11)
    naive_differs = 0
    for trial in range(1500):
        scale = float(10 ** (torch.rand((), generator=gen, dtype=torch.float64) * 5 - 4))
        if trial % 3 == 0:
            scale = float(torch.tensor(scale, dtype=torch.float32))  # an fp32 scale
        zp = int(torch.randint(-128, 128, (), generator=gen))
        a, b = sorted((torch.randn(2, generator=gen, dtype=torch.float64) * 120 * scale).tolist())
        if trial % 2:  # bounds at quantization midpoints, where roundings part ways
            a, b = ((round(v / scale) + 0.5) * scale for v in (a, b))
        if trial % 7 == 0:
            b = a  # a single value
        for activation in ("relu", "hardtanh"):
            y = _edge_values(a, b, scale, zp, gen)
            lo, hi = conv2d_output_bounds(activation, a, b, scale, zp)
            clamped_first = quantize(ref.activate(y, activation, a, b), scale, zp)
            clamped_after = quantize(y, scale, zp).clamp(lo, hi)
            assert torch.equal(clamped_first, clamped_after), (activation, scale, zp, a, b)
            if activation == "hardtanh":
                naive = [min(max(round(v / scale) + zp, -128), 127) for v in (a, b)]
                naive_differs += (naive[0], naive[1]) != (lo, hi)
    assert naive_differs > 0


def test_output_bounds_of_the_other_activations_are_the_int8_range():
    for activation in ("none", "hardswish"):
        assert conv2d_output_bounds(activation, 1.0, 2.0, 0.05, 3) == (-128, 127)
    assert conv2d_output_bounds("relu", 5.0, 1.0, 0.05, 3) == (3, 127)  # bounds ignored
    assert conv2d_output_bounds("hardtanh", 0.0, 6.0, 6 / 255, -128) == (-128, 127)
    with pytest.raises(ValueError, match="'gelu' is not one of"):
        conv2d_output_bounds("gelu", 0.0, 6.0, 0.05, 0)


def test_hardswish_evaluation_order_and_pytorch():
    """(y * clamp(y + 3, 0, 6)) * fp32(1/6), each step rounded to fp32 (numpy as the
    independent fp32 arithmetic); PyTorch divides by 6, so it may be one ulp off."""
    gen = torch.Generator().manual_seed(5)
    y = torch.cat([torch.randn(200_000, generator=gen) * 4,
                   torch.tensor([-3.0, 3.0, 0.0, -0.0, -4.0, 1e-30, 65504.0])])
    got = ref.activate(y, "hardswish")
    v = y.numpy()
    gate = np.clip(v + np.float32(3), np.float32(0), np.float32(6))
    want = (v * gate) * np.float32(1 / 6)
    assert want.dtype == np.float32
    assert np.array_equal(got.numpy(), want)
    ulps = (got.view(torch.int32).to(torch.int64) - torch.nn.functional.hardswish(y)
            .view(torch.int32).to(torch.int64)).abs()
    assert ulps.max().item() <= 1
    assert (ulps == 0).double().mean().item() > 0.5


# ---------------------------------------------------------------- every variant (device)


def _variant_layouts():
    return [pytest.param(kind, variant, layout, setting, id=f"{variant}-{layout}-{setting}")
            for kind, variant, layout in variant_layouts() for setting in SETTINGS]


@pytest.mark.parametrize(("kind", "variant", "layout", "setting"), _variant_layouts())
def test_every_variant_and_layout_with_every_activation_is_bit_exact(kind, variant, layout,
                                                                     setting, dispatch_trace):
    op = runtime.get_op(CONV_OPS[kind])
    inp = inputs(TINY[kind], setting)
    want = ref.q8ta_conv2d(*inp.args())
    if setting != "none":  # the data exercise the activation
        assert not torch.equal(want, ref.q8ta_conv2d(*inputs(TINY[kind], "none").args()))
    x = Tensor.from_torch(inp.x, layout=layout)
    got = op(x, *inp.args()[1:], variant=variant)
    assert_bit_exact(got, want, f"{variant} {layout} {setting}")
    assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s != "none"])
def test_dispatcher_passes_the_activation_through_every_route(setting):
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    for kind, name in routed_cases(get_device().caps.family).items():
        inp = inputs(name, setting)
        assert_bit_exact(op(*inp.args()), ref.q8ta_conv2d(*inp.args()), f"{kind} {setting}")


def test_hardtanh_bounds_are_ignored_by_the_other_activations():
    op = runtime.get_op("etvk.q8ta_conv2d_general.default")
    for setting in ("none", "relu", "hardswish"):
        inp = inputs(TINY["general"], setting)
        odd = dataclasses.replace(inp, activation_min=float("nan"), activation_max=-1e40)
        assert_bit_exact(op(*odd.args()), ref.q8ta_conv2d(*inp.args()), setting)


# ---------------------------------------------------------------- against PyTorch (host)


def _agreement(activation: str, pytorch) -> tuple[int, float]:
    """(elements, exact fraction) of the reference against `pytorch` over every case
    with its activation replaced (hardtanh's bounds: ReLU6's unless the case has its own)."""
    total = exact = 0
    for case in CASES:
        if case.activation != activation:
            case = dataclasses.replace(case, activation=activation, activation_min=0.0,
                                       activation_max=6.0)
        inp = make_inputs(case)
        out = ref.q8ta_conv2d(*inp.args())
        share = steps_apart(out, pytorch(inp), f"{case.name} {activation}")
        assert share >= MIN_EXACT, f"{case.name} {activation}: only {share:.4%} exact"
        total += out.numel()
        exact += share * out.numel()
    return total, exact / total


@pytest.mark.parametrize(("activation", "pytorch"), [
    ("hardtanh", qnnpack_conv2d),
    ("hardtanh", decomposed_conv2d),
    ("hardswish", decomposed_conv2d),
], ids=["relu6-qnnpack", "relu6-decomposed", "hardswish-decomposed"])
def test_reference_agrees_with_pytorch(activation, pytorch):
    """At most one step from PyTorch everywhere, at least 99.9 % exact over all cases."""
    total, exact = _agreement(activation, pytorch)
    assert exact >= 0.999, f"{activation} vs {pytorch.__name__}: {exact:.4%} of {total} exact"


@pytest.mark.parametrize(("lo", "hi"), [(0.0, 6.0), (-1.0, 2.0)])
def test_hardtanh_after_a_requantize_with_the_same_qparams_folds_exactly(lo, hi):
    """PT2E leaves conv -> q -> dq -> hardtanh -> q (one scale and zero point, the XNNPACK
    quantizer's pattern for ReLU6); folding the hardtanh into the conv is bit-identical."""
    for case in CASES:
        inp = make_inputs(dataclasses.replace(case, activation="hardtanh", activation_min=lo,
                                              activation_max=hi))
        s, zp = inp.output_scale, inp.output_zero_point
        q = ref.q8ta_conv2d(*dataclasses.replace(inp, activation="none").args())
        y = torch.ops.quantized_decomposed.dequantize_per_tensor(q, s, zp, -128, 127, torch.int8)
        chain = torch.ops.quantized_decomposed.quantize_per_tensor(
            torch.nn.functional.hardtanh(y, lo, hi), s, zp, -128, 127, torch.int8)
        assert_bit_exact(ref.q8ta_conv2d(*inp.args()), chain, f"{case.name} hardtanh({lo}, {hi})")


# ---------------------------------------------------------------- bad arguments

BAD = [
    ("hardtanh", 2.0, 1.0, "activation_max", ">= activation_min=2.0"),
    ("hardtanh", float("inf"), 6.0, "activation_min", "finite fp32"),
    ("hardtanh", 1e39, 6.0, "activation_min", "finite fp32"),
    ("hardtanh", 0.0, float("nan"), "activation_max", "finite fp32"),
    ("hardtanh", "0", 6.0, "activation_min", "expected a float"),
    ("hardswish", 0.0, None, "activation_max", "expected a float"),
    ("relu6", 0.0, 6.0, "activation", "one of 'none', 'relu', 'hardtanh', 'hardswish'"),
]


@pytest.mark.parametrize("op_name", [*CONV_OPS.values(), "etvk.q8ta_conv2d.default"])
@pytest.mark.parametrize(("activation", "lo", "hi", "arg", "text"), BAD,
                         ids=[f"{a}-{g}-{lo}-{hi}" for a, lo, hi, g, _ in BAD])
def test_bad_activation_arguments_name_the_op_and_argument(op_name, activation, lo, hi, arg, text):
    kind = next((k for k, name in CONV_OPS.items() if name == op_name), "general")
    inp = dataclasses.replace(inputs(TINY[kind], "none"), activation=activation,
                              activation_min=lo, activation_max=hi)
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(op_name)(*inp.args())
    message = str(info.value)
    assert message.startswith(f"{op_name}: argument '{arg}'"), message
    assert text in message, message


def test_every_activation_is_tested():
    assert {activation for activation, _, _ in SETTINGS.values()} == set(ACTIVATIONS)
