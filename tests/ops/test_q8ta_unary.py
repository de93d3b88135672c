"""q8ta_unary family (the int8 lookup tables) on the default Vulkan device, validation on.

Every case of `runtime.tools.examples_q8ta_unary` runs with a device input
in every packed layout (4-D cases) or plain (the others), with a random
table, and must equal the reference bit for bit, padding bytes included (the
raw output words are compared with the packed reference). Every int8 value
goes through the table in every layout; host inputs take their default
layouts; bad arguments name the op and the argument. The per-channel table
(q8ta_channel_lut) likewise in every packed layout, every value through each
channel's own table; the mean of per-channel fp32 tables (q8ta_channel_lut_mean)
in every packed layout, its plain output's tail bytes 0, within one step of
the float64 mean, and with one table row for every channel. Both with window sums for the output's first channels (a table
over the sums of 4 and of 9 taps) before x's channels, and with the sums alone
(no x), in every packed layout, bit-exact, padding bytes included. Host tables that
are integer affine maps (DenseNet's batch norm and relu) take the shader path that computes
the maps instead of reading the tables, with and without window sums. The
single-table op runs on 16-byte quads (4 words an invocation, the last words % 4
one by one) and, within `one_word_each`, on one word an invocation: both paths
are checked against the reference, and the dispatch's size says which ran.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import runtime
from runtime.families import q8ta_copy
from runtime.families.q8ta_copy import one_word_each, table_invocations, table_run
from runtime.ops.stub_support import affine_channels
from runtime.reference.q8ta_unary import q8ta_channel_lut, q8ta_channel_lut_mean, q8ta_lut
from runtime.reference.quantize import fp32
from runtime.tools.examples_q8ta_unary import (
    LUT_BY_NAME,
    LUT_CASES,
    affine_channel_table,
    channel_lut_inputs,
    channel_mean_inputs,
    channel_sums_inputs,
    lut_inputs,
)
from runtime.vulkan import layouts
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_lut.default"


@pytest.fixture(params=[True, False], ids=["quads", "words"])
def quads(request):
    """Runs the test with the copy-like ops on 16-byte quads (True) or, within `one_word_each`,
    one word an invocation (False)."""
    with contextlib.nullcontext() if request.param else one_word_each():
        yield request.param


def assert_path(trace_path, quads: bool, words: int) -> None:
    """The last dispatch wrote `words` words on quads (a quarter of the invocations, rounded
    up) or one word an invocation."""
    last = json.loads(trace_path.read_text().splitlines()[-1])
    assert last["global"][0] == (-(-words // 4) if quads else words), last


def run_on_device(x, table, layout):
    """Runs the op on a device x in `layout` (None: plain) and a device table; returns the
    output's raw bytes (every word written) and values."""
    with Stream() as stream:
        out = runtime.get_op(OP).record(stream, Tensor.from_torch(x, layout=layout), Tensor.from_torch(table))
        stream.run()
        assert out.layout == (layout or "contiguous")
        words = layouts.packed_words(out.shape, layout) if layout else -(-x.numel() // 4)
        raw = torch.empty(4 * words, dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        return raw, out.to_torch()


def _expected_bytes(want, layout):
    """`want` as the op writes it: packed with zero padding, or plain with a zero tail."""
    if layout:
        return layouts.pack(want, layout)
    flat = want.reshape(-1)
    return torch.cat([flat, flat.new_zeros(-flat.numel() % 4)])


def _cases():
    return [pytest.param(case.name, layout, id=f"{case.name}-{layout or 'plain'}")
            for case in LUT_CASES for layout in (PACKED_LAYOUTS if case.packed else [None])]


@pytest.mark.parametrize(("name", "layout"), _cases())
def test_case_matches_reference(name, layout, quads, dispatch_trace, dispatch_trace_path):
    x, table = lut_inputs(LUT_BY_NAME[name])
    want = q8ta_lut(x, table)
    assert torch.equal(want, table[(x.to(torch.int64) + 128)])
    raw, got = run_on_device(x, table, layout)
    assert_path(dispatch_trace_path, quads, raw.numel() // 4)
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    assert torch.equal(raw, _expected_bytes(want, layout)), f"{name} {layout}: padding bytes not 0"
    assert "q8ta_lut" in dispatch_trace()


@pytest.mark.parametrize("layout", [*PACKED_LAYOUTS, None])
def test_every_int8_value_through_a_random_table(layout):
    """Each of the 256 values at every byte position of a word, through 3 random tables."""
    values = torch.arange(-128, 128, dtype=torch.int8)
    # channel c (byte c of every packed word) holds the values rolled by c; plain, byte j of a
    # word holds values[(p - c) % 256] for p % 4 == j: every residue over the 4 channels
    x = torch.stack([values.roll(c) for c in range(4)]).reshape(1, 4, 16, 16)
    if layout is None:
        x = x.reshape(64, 16)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        table = torch.randint(-128, 128, (256,), generator=gen, dtype=torch.int8)
        assert torch.equal(run_on_device(x, table, layout)[1], table[x.long() + 128])


def test_host_inputs_take_the_default_layouts_and_torch_ops_use_the_reference():
    op = runtime.get_op(OP)
    for name, layout in (("lut_c6_w5_batch2", "4C1W"), ("plain_rows_odd", None)):
        x, table = lut_inputs(LUT_BY_NAME[name])
        with Stream() as stream:
            out = op.record(stream, x, table)
            stream.run()
            assert out.layout == (layout or "contiguous")
            assert torch.equal(out.to_torch(), q8ta_lut(x, table))
        assert torch.equal(torch.ops.etvk.q8ta_lut.default(x, table), q8ta_lut(x, table))
        assert torch.equal(op(x, table), q8ta_lut(x, table))


BAD_ARGS = [
    ("x", torch.zeros(1, 4, 2, 2), "int8"),
    ("x", torch.zeros(1, 4, 2, 2, dtype=torch.uint8), "int8"),
    ("x", torch.zeros(0, 4, dtype=torch.int8), "non-empty"),
    ("table", torch.zeros(255, dtype=torch.int8), "int8 [256]"),
    ("table", torch.zeros(1, 256, dtype=torch.int8), "int8 [256]"),
    ("table", torch.zeros(256, dtype=torch.int32), "int8 [256]"),
    ("table", None, "expected a tensor"),
]


@pytest.mark.parametrize(("arg", "value", "text"), BAD_ARGS, ids=[f"{a}-{t}" for a, _, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(arg, value, text):
    op = runtime.get_op(OP)
    args = dict(zip(("x", "table"), lut_inputs(LUT_BY_NAME["lut_c3_w1"]), strict=True))
    args[arg] = value
    with pytest.raises((ValueError, TypeError)) as info:
        op(*args.values())
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message


def test_a_device_table_in_a_packed_layout_is_refused():
    x, table = lut_inputs(LUT_BY_NAME["lut_c3_w1"])
    packed = Tensor.from_torch(torch.zeros(1, 256, 1, 1, dtype=torch.int8), layout="4C")
    with pytest.raises(ValueError, match=rf"^{OP}: argument 'table'.*plain buffer"):
        runtime.get_op(OP)(x, packed)


def test_cases_cover_what_they_claim():
    """Padding channels, 4W4C padding widths, a batch, plain tensors with a partial last word,
    and, on quads, every count of last words (0 to 3) after whole quads, packed and plain."""
    packed = [c.shape for c in LUT_CASES if c.packed]
    assert any(s[1] % 4 for s in packed) and any(s[3] % 4 for s in packed) and any(s[0] > 1 for s in packed)
    assert any(s[1] % 4 == 0 and s[3] % 4 == 0 for s in packed)
    plain = [c.shape for c in LUT_CASES if not c.packed]
    assert {torch.Size(s).numel() % 4 for s in plain} >= {0, 1}
    packed_words = [layouts.packed_words(s, layout) for s in packed for layout in PACKED_LAYOUTS]
    plain_words = [-(-torch.Size(s).numel() // 4) for s in plain]
    assert {w % 4 for w in plain_words if w > 4} >= {1, 2}
    assert {w % 4 for w in packed_words if w > 4} == {0, 1, 2, 3}


CHANNEL_OP = "etvk.q8ta_channel_lut.default"


def run_channel_lut(x, table, layout):
    """Runs the per-channel op on a device x in `layout` and a device table; returns the output's
    raw bytes (every word written) and values."""
    with Stream() as stream:
        out = runtime.get_op(CHANNEL_OP).record(stream, Tensor.from_torch(x, layout=layout),
                                                 Tensor.from_torch(table))
        stream.run()
        assert out.layout == layout
        raw = torch.empty(4 * layouts.packed_words(out.shape, layout), dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        return raw, out.to_torch()


def _channel_cases():
    return [pytest.param(case.name, layout, id=f"{case.name}-{layout}")
            for case in LUT_CASES if case.packed for layout in PACKED_LAYOUTS]


@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_case_matches_reference(name, layout, dispatch_trace):
    x, table = channel_lut_inputs(LUT_BY_NAME[name])
    want = q8ta_channel_lut(x, table)
    for c in range(x.shape[1]):
        assert torch.equal(want[:, c], table[c][x[:, c].long() + 128])
    raw, got = run_channel_lut(x, table, layout)
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    assert torch.equal(raw, layouts.pack(want, layout)), f"{name} {layout}: padding bytes not 0"
    assert "q8ta_channel_lut" in dispatch_trace()


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_channel_lut_every_int8_value_in_every_channel(layout):
    """Each of the 256 values in each of 7 channels (a padding channel in the last word), each
    channel through its own random table."""
    values = torch.arange(-128, 128, dtype=torch.int8)
    x = torch.stack([values.roll(31 * c) for c in range(7)]).reshape(1, 7, 16, 16)
    table = torch.randint(-128, 128, (7, 256), generator=torch.Generator().manual_seed(9), dtype=torch.int8)
    got = run_channel_lut(x, table, layout)[1]
    assert torch.equal(got, torch.stack([table[c][x[0, c].long() + 128] for c in range(7)])[None])


def _record(op, x, x_layout, *args, **kwargs):
    """`op` on a device x in `x_layout` (x None: no x) and device copies of the tensors of `args`;
    the output's raw bytes (every word written, packed or plain) and values."""
    with Stream() as stream:
        device = [Tensor.from_torch(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = op.record(stream, None if x is None else Tensor.from_torch(x, layout=x_layout), *device, **kwargs)
        stream.run()
        words = layouts.packed_words(out.shape, out.layout) if out.packed else -(-out.shape.numel() // 4)
        raw = torch.empty(4 * words, dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        return raw, out.to_torch()


@pytest.mark.parametrize("taps", [4, 9])
@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_with_window_sums_matches_reference(name, layout, taps):
    """The sums' Cs channels first ((C + 1) // 2 of them: x's channels straddle output words
    where Cs % 4 != 0), then x's C channels; and the sums alone (no x)."""
    x, table = channel_lut_inputs(LUT_BY_NAME[name])
    sums, sums_table = channel_sums_inputs(LUT_BY_NAME[name], taps, torch.int8)
    cs = sums.shape[1]
    want = q8ta_channel_lut(x, table, sums, sums_table)
    assert want.shape == (x.shape[0], cs + x.shape[1], *x.shape[2:])
    assert torch.equal(want[:, cs:], q8ta_channel_lut(x, table))
    for c in range(cs):
        assert torch.equal(want[:, c], sums_table[c][sums[:, c].long() + 128 * taps])
    alone = q8ta_channel_lut(None, None, sums, sums_table)
    assert torch.equal(alone, want[:, :cs])
    op = runtime.get_op(CHANNEL_OP)
    for x_, table_, expected, kwargs in ((x, table, want, {}), (None, None, alone, {"layout": layout})):
        raw, got = _record(op, x_, layout, table_, sums, sums_table, **kwargs)
        assert torch.equal(got, expected), f"{name} {layout}: {int((got != expected).sum())} values differ"
        assert torch.equal(raw, layouts.pack(expected, layout)), f"{name} {layout}: padding bytes not 0"


RUN_NAMES = ("densenet_table_c64_batch2", "table_c29_h2_w9")  # 4C runs with maps (padding channels in the second)


@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_affine_tables_match_reference(name, layout, dispatch_trace_path, monkeypatch):
    """Host tables of integer affine maps: the shader computes them (AFFINE 1), x's channels
    alone and after window sums' channels (which straddle x's words where Cs % 4 != 0), whose
    table is random (read) or itself of maps (AFFINE_SUMS 1, host), and those sums alone (no x).
    Without window sums, in 4C where the quads line up, 16-channel quads at runs of pixels
    (`RUN_NAMES`: 30 pixels, the last run of 2; 3 padding channels, which read maps of 0), here
    however few the invocations."""
    monkeypatch.setattr(q8ta_copy, "TABLE_RUN_MIN_INVOCATIONS", 0)
    case = LUT_BY_NAME[name]
    x, _ = channel_lut_inputs(case)
    table = affine_channel_table(case.shape[1], sum(case.shape), relu=len(name) % 2 == 0)
    sums, sums_table = channel_sums_inputs(case, 4, torch.int8)
    affine_sums = affine_channel_table(sums.shape[1], len(name), taps=4)
    for t in (table, affine_sums):
        assert affine_channels(t) is not None  # so the op binds the maps, not the table
    op = runtime.get_op(CHANNEL_OP)
    device_sums = Tensor.from_torch(sums)
    for xs, sums_args in (((x, table), ()), ((x, table), (device_sums, Tensor.from_torch(sums_table))),
                          ((x, table), (device_sums, affine_sums)), ((None, None), (device_sums, affine_sums))):
        want = q8ta_channel_lut(*xs, *(t.to_torch() if isinstance(t, Tensor) else t for t in sums_args))
        with Stream() as stream:
            out = op.record(stream, None if xs[0] is None else Tensor.from_torch(x, layout=layout), xs[1],
                            *sums_args, layout=layout)
            stream.run()
            raw = torch.empty(4 * layouts.packed_words(out.shape, layout), dtype=torch.int8)
            out.memory.read(raw.data_ptr(), raw.numel())
            got = out.to_torch()
        what = f"{name} {layout} with {len(sums_args)} sums arguments{'' if xs[0] is not None else ', no x'}"
        run = table_run(layout, want.shape, [want.shape[1]], not sums_args)
        assert run > 1 or not (layout == "4C" and name in RUN_NAMES and not sums_args)
        invocations = layouts.packed_words(want.shape, layout) if run == 1 else table_invocations(want.shape, run)
        assert json.loads(dispatch_trace_path.read_text().splitlines()[-1])["global"][0] == invocations
        assert torch.equal(got, want), f"{what}: {int((got != want).sum())} values differ"
        assert torch.equal(raw, layouts.pack(want, layout)), f"{what}: padding bytes not 0"


@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_mean_with_window_sums_matches_reference(name, layout):
    x, table, scale, zero_point = channel_mean_inputs(LUT_BY_NAME[name])
    sums, sums_table = channel_sums_inputs(LUT_BY_NAME[name], 4, torch.float32)
    cs = sums.shape[1]
    want = q8ta_channel_lut_mean(x, table, scale, zero_point, sums, sums_table)
    assert want.shape == (x.shape[0], cs + x.shape[1])
    assert torch.equal(want[:, cs:], q8ta_channel_lut_mean(x, table, scale, zero_point))
    alone = q8ta_channel_lut_mean(None, None, scale, zero_point, sums, sums_table)
    assert torch.equal(alone, want[:, :cs])
    values = torch.stack([sums_table[c][sums[:, c].long() + 512].double().mean((1, 2)) for c in range(cs)], 1)
    steps = (alone.int() - (values / fp32(scale)).round().add(zero_point).clamp(-128, 127).int()).abs()
    assert int(steps.max()) <= 1
    op = runtime.get_op(MEAN_OP)
    for x_, table_, expected in ((x, table, want), (None, None, alone)):
        raw, got = _record(op, x_, layout, table_, scale, zero_point, sums, sums_table)
        assert torch.equal(got, expected), f"{name} {layout}: {int((got != expected).sum())} values differ"
        assert torch.equal(raw, _expected_bytes(expected, None)), f"{name} {layout}: bytes past the end not 0"


@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_mean_keepdim_writes_the_packed_map(name, layout):
    """With keepdim the means are the packed ``[N, C, 1, 1]`` map a conv reads: the plain
    output's values in x's layout (padding channels and, in 4W4C, widths 0), with x, with the
    window sums before it, and from the sums alone (the `layout` argument's)."""
    x, table, scale, zero_point = channel_mean_inputs(LUT_BY_NAME[name])
    sums, sums_table = channel_sums_inputs(LUT_BY_NAME[name], 4, torch.float32)
    op = runtime.get_op(MEAN_OP)
    for x_, table_, sums_, sums_table_, kwargs in ((x, table, None, None, {}), (x, table, sums, sums_table, {}),
                                                   (None, None, sums, sums_table, {"layout": layout})):
        rows = q8ta_channel_lut_mean(x_, table_, scale, zero_point, sums_, sums_table_)
        want = rows.view(*rows.shape, 1, 1)
        assert torch.equal(q8ta_channel_lut_mean(x_, table_, scale, zero_point, sums_, sums_table_, True), want)
        raw, got = _record(op, x_, layout, table_, scale, zero_point, sums_, sums_table_, True, **kwargs)
        assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
        assert torch.equal(raw, layouts.pack(want, layout)), f"{name} {layout}: padding bytes not 0"


def test_window_sums_bad_arguments():
    x, table = channel_lut_inputs(LUT_BY_NAME["lut_c5_w9"])
    sums, sums_table = channel_sums_inputs(LUT_BY_NAME["lut_c5_w9"], 4, torch.int8)
    op = runtime.get_op(CHANNEL_OP)
    for arg, value, text in (("sums", sums.long(), "int32 [N, Cs, H, W]"),
                             ("sums", sums[:, :, :1], "x's N, H, W"),
                             ("sums", torch.zeros(1, 0, 2, 9, dtype=torch.int32), "Cs >= 1"),
                             ("sums_table", sums_table[:, :-1], "[Cs, 255 * K + 1]"),
                             ("sums_table", sums_table.float(), "int8 [Cs"),
                             ("sums_table", None, "given with sums"),
                             ("table", None, "given with x"),
                             ("layout", "4W", "one of")):
        args = {"x": x, "table": table, "sums": sums, "sums_table": sums_table, "layout": None, arg: value}
        with pytest.raises((ValueError, TypeError)) as info:
            op(*args.values())
        assert str(info.value).startswith(f"{op.name}: argument '{arg}'") and text in str(info.value)
    with pytest.raises(ValueError, match="argument 'sums_table'.*given with sums"):
        op(x, table, None, sums_table)
    with pytest.raises(ValueError, match="argument 'x'.*unless sums give every channel"):
        op(None, None)
    with pytest.raises(ValueError, match="argument 'table'.*None without it"):
        op(None, table, sums, sums_table)
    with pytest.raises(ValueError, match="argument 'layout'.*x's"), Stream() as stream:
        op.record(stream, Tensor.from_torch(x, layout="4C"), Tensor.from_torch(table), layout="4C1W")
    mean = runtime.get_op(MEAN_OP)
    with pytest.raises(ValueError, match="argument 'x'.*unless sums give every channel"):
        mean(None, None, 0.1, 0)


def test_channel_lut_host_inputs_and_bad_arguments():
    op = runtime.get_op(CHANNEL_OP)
    x, table = channel_lut_inputs(LUT_BY_NAME["lut_c5_w9"])
    assert torch.equal(op(x, table), q8ta_channel_lut(x, table))
    assert torch.equal(torch.ops.etvk.q8ta_channel_lut.default(x, table), q8ta_channel_lut(x, table))
    for arg, value, text in (("x", x[0], "int8 [N, C, H, W]"), ("x", x.float(), "int8 [N, C, H, W]"),
                             ("table", table[:4], "int8 [C_x, 256] tensor"),
                             ("table", table.view(-1), "int8 [C_x, 256]")):
        args = {"x": x, "table": table, arg: value}
        with pytest.raises((ValueError, TypeError)) as info:
            op(*args.values())
        assert str(info.value).startswith(f"{op.name}: argument '{arg}'") and text in str(info.value)


MEAN_OP = "etvk.q8ta_channel_lut_mean.default"


@pytest.mark.parametrize(("name", "layout"), _channel_cases())
def test_channel_lut_mean_case_matches_reference(name, layout):
    x, table, scale, zero_point = channel_mean_inputs(LUT_BY_NAME[name])
    want = q8ta_channel_lut_mean(x, table, scale, zero_point)
    # the definition, in float64: at most one step from the fp32 order (rounding ties)
    exact = torch.stack([table[c][x[:, c].long() + 128].double().mean((1, 2)) for c in range(x.shape[1])], 1)
    steps = (want.int() - (exact / fp32(scale)).round().add(zero_point).clamp(-128, 127).int()).abs()
    assert int(steps.max()) <= 1
    with Stream() as stream:
        out = runtime.get_op(MEAN_OP).record(stream, Tensor.from_torch(x, layout=layout), Tensor.from_torch(table),
                                              scale, zero_point)
        stream.run()
        raw = torch.empty(4 * -(-x.shape[0] * x.shape[1] // 4), dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        got = out.to_torch()
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    assert torch.equal(raw, _expected_bytes(want, None)), f"{name} {layout}: bytes past the end not 0"


def _cancelling_mean_inputs(h: int, w: int, channels: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """x whose channels are permutations of one map of values in +-pairs (and a 0 where H*W is
    odd), and one odd table row (table[-q] = -table[q], values up to 1000): every channel's
    exact mean is 0, so its fp32 mean is the rounding residue of its summation order alone."""
    gen = torch.Generator().manual_seed(11)
    half = torch.randint(1, 128, (h * w // 2,), generator=gen, dtype=torch.int8)
    first = torch.cat([half, -half, torch.zeros(h * w % 2, dtype=torch.int8)])
    x = torch.stack([first[torch.randperm(h * w, generator=gen)] for _ in range(channels)]).view(1, channels, h, w)
    positive = torch.rand(127, generator=gen, dtype=torch.float64) * 1000
    table = torch.cat([torch.zeros(1), -positive.flip(0), torch.zeros(1), positive]).float().view(1, 256)
    return x, table


@pytest.mark.parametrize(("h", "w"), [(7, 7), (17, 19), (56, 56)])
def test_channel_lut_mean_keeps_the_summation_order(h, w):
    """Means that are 0 exactly and in fp32 only the residue of the order (quantized on a scale
    that shows a few ulps of it): the device equals the reference's order, which differs from
    channel to channel; any other order of the same additions would give other residues."""
    x, row = _cancelling_mean_inputs(h, w)
    scale = 1e-8
    want = q8ta_channel_lut_mean(x, row, scale, 0)
    assert len(set(want.flatten().tolist())) > 2, "the residues do not tell the orders apart"
    with Stream() as stream:
        out = runtime.get_op(MEAN_OP).record(stream, Tensor.from_torch(x, layout="4C1W"), Tensor.from_torch(row),
                                              scale, 0)
        stream.run()
        got = out.to_torch()
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} means differ"


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_channel_lut_mean_with_one_table_row_for_every_channel(layout):
    """A ``[1, 256]`` table serves every channel: the values of its ``[C, 256]`` copy, on the
    device bit for bit."""
    x, table, scale, zero_point = channel_mean_inputs(LUT_BY_NAME["lut_c6_w5_batch2"])
    row = table[:1]
    want = q8ta_channel_lut_mean(x, row.expand(x.shape[1], 256).contiguous(), scale, zero_point)
    assert torch.equal(q8ta_channel_lut_mean(x, row, scale, zero_point), want)
    with Stream() as stream:
        out = runtime.get_op(MEAN_OP).record(stream, Tensor.from_torch(x, layout=layout), Tensor.from_torch(row),
                                              scale, zero_point)
        stream.run()
        got = out.to_torch()
    assert torch.equal(got, want)


def test_channel_lut_mean_host_inputs_and_bad_arguments():
    op = runtime.get_op(MEAN_OP)
    x, table, scale, zero_point = channel_mean_inputs(LUT_BY_NAME["lut_c6_w5_batch2"])
    want = q8ta_channel_lut_mean(x, table, scale, zero_point)
    assert torch.equal(op(x, table, scale, zero_point), want)
    assert torch.equal(torch.ops.etvk.q8ta_channel_lut_mean.default(x, table, scale, zero_point), want)
    for arg, value, text in (("table", table.to(torch.float16), "fp32 [C_x, 256]"),
                             ("table", table[:5], "fp32 [C_x, 256] tensor"),
                             ("output_zero_point", 128, "int8"), ("output_scale", 0.0, "within")):
        args = {"x": x, "table": table, "output_scale": scale, "output_zero_point": zero_point, arg: value}
        with pytest.raises((ValueError, TypeError)) as info:
            op(*args.values())
        assert str(info.value).startswith(f"{op.name}: argument '{arg}'") and text in str(info.value)


def test_channel_lut_fake_shapes_without_x():
    """The ops' fake kernels (shape inference under export) take the sums' device and shape where
    x is None, and add x's channels after them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, table = channel_lut_inputs(LUT_BY_NAME["lut_c5_w9"])
    sums, sums_table = channel_sums_inputs(LUT_BY_NAME["lut_c5_w9"], 4, torch.int8)
    mean_table = sums_table.float()
    with FakeTensorMode() as mode:
        fx, ft, fs, fst, fmt = (mode.from_tensor(t) for t in (x, table, sums, sums_table, mean_table))
        assert torch.ops.etvk.q8ta_channel_lut.default(None, None, fs, fst).shape == sums.shape
        assert torch.ops.etvk.q8ta_channel_lut.default(fx, ft, fs, fst).shape == (1, 8, 2, 9)
        assert torch.ops.etvk.q8ta_channel_lut_mean.default(None, None, 0.1, 0, fs, fmt).shape == (1, 3)
