"""q8ta_concat_channel_lut (the concat and the per-channel tables that read it, one dispatch) on
the default Vulkan device, validation on.

Every concat case of `runtime.tools.examples_q8ta_binary` (C_a % 4 of 0 .. 3, batch 2, widths
that are not multiples of 4, qparams that requantize, inputs in the output's qparams) and the
raw copy of DenseNet's lowering (every scale 1, zero point 0) run in every packed layout with
device inputs and a random table per channel, and both outputs must equal the reference
(q8ta_concat, then q8ta_channel_lut of its output) bit for bit, padding bytes included, from one
dispatch of the fused shader; the reference itself must equal the two ops run on the device one
after the other. Host inputs take 4C1W; bad arguments name the op and argument.
"""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from runtime.reference.q8ta_binary import q8ta_concat_channel_lut
from runtime.tools.examples_q8ta_binary import (
    CONCAT_BY_NAME,
    CONCAT_CASES,
    concat_channel_lut_inputs,
)
from runtime.vulkan import layouts
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_concat_channel_lut.default"


def fused_inputs(name: str, raw: bool) -> tuple:
    return concat_channel_lut_inputs(CONCAT_BY_NAME[name], raw=raw)


def _trace_lines(path) -> list[str]:
    """The dispatch trace's lines so far (none before the first dispatch writes the file)."""
    return path.read_text().splitlines() if path.exists() else []


def _raw(out) -> torch.Tensor:
    """Every byte of a device output's packed words."""
    raw = torch.empty(4 * layouts.packed_words(out.shape, out.layout), dtype=torch.int8)
    out.memory.read(raw.data_ptr(), raw.numel())
    return raw


def run_fused(args: tuple, layout: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fused op on device a, b (in `layout`) and table: each output's raw bytes and values."""
    with Stream() as stream:
        a, b = (Tensor.from_torch(args[i], layout=layout) for i in (0, 3))
        outputs = runtime.get_op(OP).record(stream, a, *args[1:3], b, *args[4:8], Tensor.from_torch(args[8]))
        stream.run()
        assert [o.layout for o in outputs] == [layout, layout]
        return [(_raw(o), o.to_torch()) for o in outputs]


def run_two_ops(args: tuple, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q8ta_concat then q8ta_channel_lut of its device output, as two dispatches."""
    with Stream() as stream:
        a, b = (Tensor.from_torch(args[i], layout=layout) for i in (0, 3))
        concat = runtime.get_op("etvk.q8ta_concat.default").record(stream, a, *args[1:3], b, *args[4:8])
        out = runtime.get_op("etvk.q8ta_channel_lut.default").record(stream, concat, Tensor.from_torch(args[8]))
        stream.run()
        return concat.to_torch(), out.to_torch()


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("raw", [False, True], ids=["requantized", "raw_copy"])
@pytest.mark.parametrize("name", [case.name for case in CONCAT_CASES])
def test_both_outputs_match_reference(name, raw, layout, dispatch_trace_path):
    args = fused_inputs(name, raw)
    want = q8ta_concat_channel_lut(*args)
    table = args[8]
    for c in range(want[0].shape[1]):
        assert torch.equal(want[1][:, c], table[c][want[0][:, c].long() + 128])
    before = len(_trace_lines(dispatch_trace_path))
    got = run_fused(args, layout)
    trace = [json.loads(line) for line in _trace_lines(dispatch_trace_path)[before:]]
    assert [t["variant"] for t in trace] == ["q8ta_concat_channel_lut"]
    assert trace[0]["global"][0] == layouts.packed_words(want[0].shape, layout)
    for what, (raw_bytes, values), expected in zip(("concat", "out"), got, want, strict=True):
        assert torch.equal(values, expected), f"{name} {layout} {what}: {int((values != expected).sum())} differ"
        assert torch.equal(raw_bytes, layouts.pack(expected, layout)), f"{name} {layout} {what}: padding not 0"


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_reference_equals_the_two_ops_on_the_device(layout):
    for name in ("densenet_concat_c6_c4", "concat_c7_c6_batch2", "concat_c16_c13_w4"):
        args = fused_inputs(name, raw=False)
        for got, want in zip(run_two_ops(args, layout), q8ta_concat_channel_lut(*args), strict=True):
            assert torch.equal(got, want), f"{name} {layout}"


def test_host_inputs_default_to_4c1w_and_torch_ops_use_the_reference():
    args = fused_inputs("concat_c5_c7", raw=False)
    want = q8ta_concat_channel_lut(*args)
    op = runtime.get_op(OP)
    with Stream() as stream:
        outputs = op.record(stream, *args)
        stream.run()
        assert [o.layout for o in outputs] == ["4C1W", "4C1W"]
        for got, expected in zip(outputs, want, strict=True):
            assert torch.equal(got.to_torch(), expected)
    for got, expected in zip(torch.ops.etvk.q8ta_concat_channel_lut.default(*args), want, strict=True):
        assert torch.equal(got, expected)


BAD_ARGS = [
    ("table", torch.zeros(11, 256, dtype=torch.int8), "[C_a + C_b, 256] tensor = (12, 256)"),
    ("table", torch.zeros(12, 255, dtype=torch.int8), "[C_a + C_b, 256]"),
    ("table", torch.zeros(12, 256, dtype=torch.float32), "int8"),
    ("b", torch.zeros(1, 7, 3, 4, dtype=torch.int8), "N, H and W"),
    ("a", torch.zeros(1, 5, 3, 5), "int8"),
    ("output_scale", 0.0, "> 0"),
    ("a_zero_point", 128, "[-128, 127]"),
]


@pytest.mark.parametrize(("arg", "value", "text"), BAD_ARGS, ids=[f"{a}-{t}" for a, _, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(arg, value, text):
    args = list(fused_inputs("concat_c5_c7", raw=False))
    names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "output_scale",
             "output_zero_point", "table"]
    args[names.index(arg)] = value
    op = runtime.get_op(OP)
    with pytest.raises((ValueError, TypeError)) as info:
        op(*args)
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message
