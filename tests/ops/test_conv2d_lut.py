"""The lookup table of the conv epilogue (``lut`` of every int8 conv op): the conv's int8 output,
then q8ta_lut's gather.

- the reference is conv -> q8ta_lut;
- every variant of every conv op (algorithm x DOT x input layout) after conv
  activations, bit-exact against the reference and against the two device ops
  it replaces (q8ta_conv2d, then q8ta_lut), padding bytes 0 although the
  table's entry for 0 is not; the dispatcher passes the table through each of
  its routes; a device table as well as a host one; (the coop GEMMs and their
  split-K reduce: tests/ops/test_conv2d_coop.py);
- bad tables, and a table with a residual, name the op and the argument.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conv_testlib import (
    CONV_OPS,
    TINY,
    assert_bit_exact,
    packed_bytes,
    random_lut,
    residual_args,
    routed_cases,
    variant_layouts,
)

import runtime
from runtime.reference import conv2d as ref
from runtime.reference.q8ta_unary import q8ta_lut
from runtime.tools.examples_conv2d import CASES_BY_NAME, make_inputs
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

ACTIVATIONS = ("none", "relu", "hardswish")


def test_reference_is_conv_then_the_table():
    for kind, name in TINY.items():
        inp = make_inputs(CASES_BY_NAME[name])
        table = random_lut(1)
        got = ref.q8ta_conv2d(*inp.args(), lut=table)
        assert_bit_exact(got, q8ta_lut(ref.q8ta_conv2d(*inp.args()), table), kind)


def _cases():
    return [pytest.param(kind, variant, layout, activation, id=f"{variant}-{layout}-{activation}")
            for kind, variant, layout in variant_layouts() for activation in ACTIVATIONS]


@pytest.mark.parametrize(("kind", "variant", "layout", "activation"), _cases())
def test_every_variant_and_layout_applies_the_table_bit_exact(kind, variant, layout, activation,
                                                              dispatch_trace):
    """One dispatch (two for im2col) gives the bytes of q8ta_conv2d then q8ta_lut on the device
    (padding included) and the reference's values."""
    op = runtime.get_op(CONV_OPS[kind])
    inp = make_inputs(dataclasses.replace(CASES_BY_NAME[TINY[kind]], activation=activation))
    table = random_lut(2)
    want = q8ta_lut(ref.q8ta_conv2d(*inp.args()), table)
    with Stream() as stream:
        x = Tensor.from_torch(inp.x, layout=layout)
        fused = op.record(stream, x, *inp.args()[1:], lut=table, variant=variant)
        alone = op.record(stream, x, *inp.args()[1:], variant=variant)
        mapped = runtime.get_op("etvk.q8ta_lut.default").record(stream, alone, table)
        stream.run()
        assert fused.layout == layout
        assert_bit_exact(fused.to_torch(), want, f"{variant} {layout} {activation}")
        assert torch.equal(packed_bytes(fused), packed_bytes(mapped)), f"{variant} {layout} {activation}: two ops"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


def test_dispatcher_passes_a_device_table_through_every_route():
    op = runtime.get_op("etvk.q8ta_conv2d.default")
    table = random_lut(3)
    for kind, name in routed_cases(get_device().caps.family).items():
        inp = make_inputs(CASES_BY_NAME[name])
        with Stream() as stream:
            out = op.record(stream, inp.x, *inp.args()[1:], lut=Tensor.from_torch(table))
            stream.run()
            assert_bit_exact(out.to_torch(), ref.q8ta_conv2d(*inp.args(), lut=table), kind)


BAD = [
    ({"lut": torch.zeros(255, dtype=torch.int8)}, "an int8 [256] tensor"),
    ({"lut": torch.zeros(256, dtype=torch.int32)}, "an int8 [256] tensor"),
    ({"lut": "with a residual"}, "cannot go with a residual"),
]


@pytest.mark.parametrize("op_name", [*CONV_OPS.values(), "etvk.q8ta_conv2d.default"])
@pytest.mark.parametrize(("changes", "text"), BAD, ids=[t[:14] for _, t in BAD])
def test_bad_tables_name_the_op_and_argument(op_name, changes, text):
    kind = next((k for k, name in CONV_OPS.items() if name == op_name), "general")
    inp = make_inputs(CASES_BY_NAME[TINY[kind]])
    shape = CASES_BY_NAME[TINY[kind]].params.output_shape
    residual = (None, 1.0, 0, 1.0, 0, "none")
    if changes["lut"] == "with a residual":
        residual = residual_args(inp, shape, 5, "none")
        changes = {"lut": random_lut(5)}
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(op_name)(*inp.args(), *residual, **changes)
    message = str(info.value)
    assert message.startswith(f"{op_name}: argument 'lut'"), message
    assert text in message, message
