"""q8ta_concat_channel_lut (the concat and the per-channel tables that read it, one dispatch) on
the default Vulkan device, validation on.

Every concat case of `runtime.tools.examples_q8ta_binary` (C_a % 4 of 0 .. 3, batch 2, widths
that are not multiples of 4, qparams that requantize, inputs in the output's qparams) and the
raw copy of DenseNet's lowering (every scale 1, zero point 0) run in every packed layout with
device inputs and a random table per channel, and both outputs must equal the reference
(q8ta_concat, then q8ta_channel_lut of its output) bit for bit, padding bytes included, from one
dispatch of the fused shader; the reference itself must equal the two ops run on the device one
after the other. The window-sums form (the table output's first Cs channels, Cs = 4, 8, 12, 16,
from int32 window sums through their tables, as q8ta_channel_lut has them) runs likewise over
concat cases with batch 2, C_a % 4 != 0 and widths that are not multiples of 4, raw and
requantized, in every layout, against the reference and the two ops on the device. Host tables
that are integer affine maps (DenseNet's batch norm and relu) take the shader path that computes
the maps, with and without window sums. Host inputs take 4C1W; bad arguments name the op and
argument.
"""

from __future__ import annotations

import json

import pytest
import torch

import runtime
from runtime.families import q8ta_copy
from runtime.families.q8ta_copy import table_invocations, table_run
from runtime.ops.stub_support import affine_channels
from runtime.reference.q8ta_binary import q8ta_concat_channel_lut
from runtime.tools.examples_q8ta_binary import (
    CONCAT_BY_NAME,
    CONCAT_CASES,
    concat_channel_lut_inputs,
)
from runtime.tools.examples_q8ta_unary import affine_channel_table
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


def _device(args: tuple, layout: str, host_table: bool = False) -> list:
    """`args` with a and b on the device in `layout` and the tables and sums plain buffers (the
    tables, arguments 8 and 10, stay on the host where `host_table`)."""
    return [Tensor.from_torch(v, layout=layout) if i in (0, 3) else
            v if i in (8, 10) and host_table else
            Tensor.from_torch(v) if isinstance(v, torch.Tensor) else v for i, v in enumerate(args)]


def run_fused(args: tuple, layout: str, host_table: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The fused op on device a, b (in `layout`), table and sums: each output's raw bytes and values."""
    with Stream() as stream:
        outputs = runtime.get_op(OP).record(stream, *_device(args, layout, host_table))
        stream.run()
        assert [o.layout for o in outputs] == [layout, layout]
        return [(_raw(o), o.to_torch()) for o in outputs]


def run_two_ops(args: tuple, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """q8ta_concat then q8ta_channel_lut of its device output (with the sums), as two dispatches."""
    device = _device(args, layout)
    with Stream() as stream:
        concat = runtime.get_op("etvk.q8ta_concat.default").record(stream, *device[:8])
        out = runtime.get_op("etvk.q8ta_channel_lut.default").record(stream, concat, *device[8:])
        stream.run()
        return concat.to_torch(), out.to_torch()


def _invocations(args: tuple, out_shape, layout: str, host_table: bool) -> int:
    """The dispatch's invocations: one a word of the table output, or where `table_run` gives
    runs (4C, a host table of maps, no window sums), as `table_invocations` counts them."""
    a, b, table = args[0], args[3], args[8]
    maps = host_table and len(args) == 9 and affine_channels(table) is not None
    run = table_run(layout, out_shape, [a.shape[1], b.shape[1]], maps)
    return layouts.packed_words(out_shape, layout) if run == 1 else table_invocations(out_shape, run)


def check_fused(args: tuple, layout: str, trace_path, what: str, host_table: bool = False) -> None:
    """One dispatch of the fused shader over the table output's words, both outputs equal to the
    reference bit for bit, padding bytes included."""
    want = q8ta_concat_channel_lut(*args)
    before = len(_trace_lines(trace_path))
    got = run_fused(args, layout, host_table)
    trace = [json.loads(line) for line in _trace_lines(trace_path)[before:]]
    assert [t["variant"] for t in trace] == ["q8ta_concat_channel_lut"]
    assert trace[0]["global"][0] == _invocations(args, want[1].shape, layout, host_table)
    for name, (raw_bytes, values), expected in zip(("concat", "out"), got, want, strict=True):
        assert torch.equal(values, expected), f"{what} {layout} {name}: {int((values != expected).sum())} differ"
        assert torch.equal(raw_bytes, layouts.pack(expected, layout)), f"{what} {layout} {name}: padding not 0"


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("raw", [False, True], ids=["requantized", "raw_copy"])
@pytest.mark.parametrize("name", [case.name for case in CONCAT_CASES])
def test_both_outputs_match_reference(name, raw, layout, dispatch_trace_path):
    args = fused_inputs(name, raw)
    want = q8ta_concat_channel_lut(*args)
    table = args[8]
    for c in range(want[0].shape[1]):
        assert torch.equal(want[1][:, c], table[c][want[0][:, c].long() + 128])
    check_fused(args, layout, dispatch_trace_path, name)


# (concat case, Cs, raw): batch 2 with W = 3 and 4, W = 6 and 5, C_a % 4 of 0 .. 3; 16 output
# channel words (4C's tiles of 8) over 30 pixels
SUMS_CASES = [("concat_c7_c6_batch2", 4, False), ("concat_c7_c6_batch2", 8, True),
              ("densenet_concat_c6_c4", 12, True), ("concat_c16_c13_w4", 16, False),
              ("concat_c5_c7", 8, False), ("concat_c1_c2", 4, True),
              ("densenet_concat_c24_c8_batch2", 32, True), ("densenet_concat_c32_c16_batch2", 16, True)]
# with host tables of maps, 4C writes 16-channel quads at runs of pixels (table_run) in these
RUN_CASES = [("densenet_concat_c32_c16_batch2", 0, False), ("concat_c16_c13_w4", 0, True)]


def sums_inputs(name: str, sums_channels: int, raw: bool) -> tuple:
    return concat_channel_lut_inputs(CONCAT_BY_NAME[name], raw=raw, sums_channels=sums_channels)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("name", "sums_channels", "raw"), SUMS_CASES,
                         ids=[f"{n}-cs{c}-{'raw' if r else 'requantized'}" for n, c, r in SUMS_CASES])
def test_sums_form_matches_reference(name, sums_channels, raw, layout, dispatch_trace_path):
    args = sums_inputs(name, sums_channels, raw)
    concat, out = q8ta_concat_channel_lut(*args)
    sums, sums_table = args[9:]
    taps = (sums_table.shape[1] - 1) // 255
    assert out.shape[1] == sums_channels + concat.shape[1]
    for c in range(sums_channels):
        assert torch.equal(out[:, c], sums_table[c][sums[:, c].long() + 128 * taps])
    assert torch.equal(out[:, sums_channels:], q8ta_concat_channel_lut(*args[:9])[1])
    check_fused(args, layout, dispatch_trace_path, f"{name} Cs {sums_channels}")


AFFINE_CASES = SUMS_CASES[:4] + [("concat_c5_c7", 0, False), SUMS_CASES[-1]] + RUN_CASES


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("name", "sums_channels", "raw"), AFFINE_CASES,
                         ids=[f"{n}-cs{c}" for n, c, _ in AFFINE_CASES])
def test_affine_tables_match_reference(name, sums_channels, raw, layout, dispatch_trace_path, monkeypatch):
    """Host tables of integer affine maps, the concat's and the window sums': the shader computes
    them (AFFINE 1, AFFINE_SUMS 1); without window sums, in 4C where every part's quads line up,
    16-channel quads at runs of pixels (RUN 4; 30 pixels: the last run of 2), here however few
    the invocations."""
    monkeypatch.setattr(q8ta_copy, "TABLE_RUN_MIN_INVOCATIONS", 0)
    args = list(sums_inputs(name, sums_channels, raw))
    args[8] = affine_channel_table(args[8].shape[0], sums_channels + len(name))
    if sums_channels:
        args[10] = affine_channel_table(sums_channels, len(name), taps=4)
    for table in args[8::2]:
        assert affine_channels(table) is not None  # so the op binds the maps, not the table
    a, b = args[0], args[3]
    out_shape = (a.shape[0], sums_channels + a.shape[1] + b.shape[1], *a.shape[2:])
    runs = table_run(layout, out_shape, [a.shape[1], b.shape[1]], not sums_channels) > 1
    assert runs == (layout == "4C" and (name, sums_channels, raw) in RUN_CASES)
    check_fused(tuple(args), layout, dispatch_trace_path, f"{name} Cs {sums_channels} affine", host_table=True)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_reference_equals_the_two_ops_on_the_device(layout):
    cases = [fused_inputs(name, raw=False) for name in ("densenet_concat_c6_c4", "concat_c7_c6_batch2",
                                                        "concat_c16_c13_w4")]
    cases += [sums_inputs(*case) for case in SUMS_CASES[:3]]
    for args in cases:
        for got, want in zip(run_two_ops(args, layout), q8ta_concat_channel_lut(*args), strict=True):
            assert torch.equal(got, want), f"{tuple(args[0].shape)} {layout}"


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
    ("sums", torch.zeros(1, 6, 3, 5, dtype=torch.int32), "Cs a multiple of 4"),
    ("sums", torch.zeros(1, 4, 3, 4, dtype=torch.int32), "a's N, H, W"),
    ("sums", torch.zeros(1, 4, 3, 5, dtype=torch.int8), "int32"),
    ("sums_table", torch.zeros(4, 300, dtype=torch.int8), "[Cs, 255 * K + 1]"),
    ("sums_table", None, "given with sums"),
]


@pytest.mark.parametrize(("arg", "value", "text"), BAD_ARGS, ids=[f"{a}-{t}" for a, _, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(arg, value, text):
    args = list(sums_inputs("concat_c5_c7", 4, raw=False))
    names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "output_scale",
             "output_zero_point", "table", "sums", "sums_table"]
    args[names.index(arg)] = value
    op = runtime.get_op(OP)
    with pytest.raises((ValueError, TypeError)) as info:
        op(*args)
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message
