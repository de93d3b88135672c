"""The residual add of the conv epilogue (``residual`` and the ``add_*`` arguments of every int8
conv op): the conv's int8 output, then q8ta_add's arithmetic with the residual.

- the reference is conv -> q8ta_add, which is PyTorch's decomposed
  ``dequantize -> add -> [relu] -> quantize`` of the conv's output bit for bit;
- every variant of every conv op (algorithm x DOT x input layout) with and
  without the add's relu after conv activations, bit-exact against the
  reference and against the two device ops it replaces (q8ta_conv2d, then
  q8ta_add); the dispatcher passes the residual through each of its routes;
  a host residual takes a device input's layout; (the coop GEMMs and their
  split-K reduce: tests/ops/test_conv2d_coop.py);
- bad residual arguments name the op and the argument.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
from conv_testlib import (
    CONV_OPS,
    TINY,
    assert_bit_exact,
    packed_bytes,
    residual_args,
    routed_cases,
    variant_layouts,
)

import runtime
from runtime.reference import conv2d as ref
from runtime.reference.q8ta_binary import q8ta_add
from runtime.tools.examples_conv2d import CASES, CASES_BY_NAME, make_inputs
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

QD = torch.ops.quantized_decomposed
# (conv activation, the add's activation): the add's relu after a conv without activation (a
# ResNet block), none after hardswish (the last values of the conv epilogue before the add)
SETTINGS = {"relu_after_none": ("none", "relu"), "none_after_hardswish": ("hardswish", "none"),
            "relu_after_relu6": ("hardtanh", "relu")}


def test_reference_is_conv_then_the_decomposed_add():
    """The fused reference equals dequantize -> add -> [relu] -> quantize of the conv's int8
    output (PyTorch's ops), for every case, either add activation."""
    for case in CASES:
        inp = make_inputs(case)
        conv = ref.q8ta_conv2d(*inp.args())
        for add_activation in ("none", "relu"):
            res, rs, rzp, os, ozp, _ = residual_args(inp, conv.shape, 1, add_activation)
            y = QD.dequantize_per_tensor(conv, inp.output_scale, inp.output_zero_point, -128, 127, torch.int8) \
                + QD.dequantize_per_tensor(res, rs, rzp, -128, 127, torch.int8)
            if add_activation == "relu":
                y = torch.relu(y)
            want = QD.quantize_per_tensor(y, os, ozp, -128, 127, torch.int8)
            got = ref.q8ta_conv2d(*inp.args(), res, rs, rzp, os, ozp, add_activation)
            assert_bit_exact(got, want, f"{case.name} {add_activation}")
            assert not torch.equal(got, conv)


def _cases():
    return [pytest.param(kind, variant, layout, setting, id=f"{variant}-{layout}-{setting}")
            for kind, variant, layout in variant_layouts() for setting in SETTINGS]


@pytest.mark.parametrize(("kind", "variant", "layout", "setting"), _cases())
def test_every_variant_and_layout_adds_the_residual_bit_exact(kind, variant, layout, setting,
                                                              dispatch_trace):
    """One dispatch (two for im2col) gives the bits of q8ta_conv2d then q8ta_add on the device
    (padding bytes included) and in the reference; the residual is a device tensor in the
    input's layout."""
    op = runtime.get_op(CONV_OPS[kind])
    inp = make_inputs(dataclasses.replace(CASES_BY_NAME[TINY[kind]], activation=SETTINGS[setting][0]))
    conv = ref.q8ta_conv2d(*inp.args())
    extra = residual_args(inp, conv.shape, 2, SETTINGS[setting][1])
    want = q8ta_add(conv, inp.output_scale, inp.output_zero_point, *extra)
    with Stream() as stream:
        x = Tensor.from_torch(inp.x, layout=layout)
        residual = Tensor.from_torch(extra[0], layout=layout)
        fused = op.record(stream, x, *inp.args()[1:], residual, *extra[1:], variant=variant)
        alone = op.record(stream, x, *inp.args()[1:], variant=variant)
        added = runtime.get_op("etvk.q8ta_add.default").record(
            stream, alone, inp.output_scale, inp.output_zero_point, residual, *extra[1:])
        stream.run()
        assert fused.layout == layout
        assert_bit_exact(fused.to_torch(), want, f"{variant} {layout} {setting}")
        # padding channels and 4W4C padding widths included
        assert torch.equal(packed_bytes(fused), packed_bytes(added)), f"{variant} {layout} {setting}: two ops"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("setting", SETTINGS)
def test_dispatcher_passes_the_residual_through_every_route(setting):
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    for kind, name in routed_cases(get_device().caps.family).items():
        inp = make_inputs(dataclasses.replace(CASES_BY_NAME[name], activation=SETTINGS[setting][0]))
        extra = residual_args(inp, CASES_BY_NAME[name].params.output_shape, 3, SETTINGS[setting][1])
        assert_bit_exact(op(*inp.args(), *extra), ref.q8ta_conv2d(*inp.args(), *extra), f"{kind} {setting}")


def test_a_host_input_takes_the_device_residuals_layout():
    inp = make_inputs(CASES_BY_NAME[TINY["general"]])
    extra = residual_args(inp, CASES_BY_NAME[TINY["general"]].params.output_shape, 4, "relu")
    op = runtime.get_op(CONV_OPS["general"])  # packs a host input in 4C1W
    with Stream() as stream:
        out = op.record(stream, inp.x, *inp.args()[1:], Tensor.from_torch(extra[0], layout="4W4C"), *extra[1:])
        stream.run()
        assert out.layout == "4W4C"
        assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args(), *extra), "host input")


def _bad(inp, extra, **changes):
    names = ("residual", "residual_scale", "residual_zero_point", "add_output_scale", "add_output_zero_point",
             "add_activation")
    values = dict(zip(names, extra, strict=True))
    output_scale = changes.pop("output_scale", inp.output_scale)
    values.update(changes)
    return (*dataclasses.replace(inp, output_scale=output_scale).args(), *values.values())


BAD = [
    ("residual", {"residual": torch.zeros(1, 2, 3, 4, dtype=torch.int8)}, "of the conv's output shape"),
    ("residual", {"residual": "float"}, "of the conv's output shape"),
    ("residual", {"residual": "4C"}, "the residual must be in the conv output's layout"),
    ("residual_scale", {"residual_scale": 0.0}, "within [2^-32, 2^32]"),
    ("residual_zero_point", {"residual_zero_point": 128}, "within int8"),
    ("output_scale", {"output_scale": 2.0 ** 40}, "when a residual is added"),
    ("add_output_scale", {"add_output_scale": float("inf")}, "within [2^-32, 2^32]"),
    ("add_output_zero_point", {"add_output_zero_point": -129}, "within int8"),
    ("add_activation", {"add_activation": "hardtanh"}, "must be 'none' or 'relu'"),
]


@pytest.mark.parametrize("op_name", [*CONV_OPS.values(), "etvk.q8ta_conv2d.default"])
@pytest.mark.parametrize(("arg", "changes", "text"), BAD, ids=[f"{a}-{t[:12]}" for a, _, t in BAD])
def test_bad_residual_arguments_name_the_op_and_argument(op_name, arg, changes, text):
    kind = next((k for k, name in CONV_OPS.items() if name == op_name), "general")
    inp = make_inputs(CASES_BY_NAME[TINY[kind]])
    shape = CASES_BY_NAME[TINY[kind]].params.output_shape
    extra = residual_args(inp, shape, 5, "none")
    x = inp.x
    if changes.get("residual") == "float":
        changes = {"residual": extra[0].float()}
    elif changes.get("residual") == "4C":  # a device residual in another layout than x's
        x = Tensor.from_torch(inp.x, layout="4C1W")
        changes = {"residual": Tensor.from_torch(extra[0], layout="4C")}
    args = _bad(dataclasses.replace(inp, x=x), extra, **changes)
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(op_name)(*args)
    message = str(info.value)
    assert message.startswith(f"{op_name}: argument '{arg}'"), message
    assert text in message, message
