"""Lookup tables folded into the conv that produces their input
(runtime/programs/lower_conv_lut.py), on a graph written with explicit quantize / dequantize
ops: each fold and each near miss is there on purpose. Which lookups fold and with what table,
bit-exact device runs, and the same values as the program lowered without the fold."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import Int8Convs, check_device_runs, dq, lower_and_save, q
from torch.nn import functional as F

import runtime
from runtime.programs.nodes import Const

CONV, LUT, ADD = "etvk.q8ta_conv2d.default", "etvk.q8ta_lut.default", "etvk.q8ta_add.default"
INT8 = torch.arange(-128, 128, dtype=torch.int8)
# The conv schema's residual arguments, left at their defaults by a fold.
NO_RESIDUAL = (None, 1.0, 0, 1.0, 0, "none")


# the folded lookups: (conv output qparams, f, lookup output qparams)
FOLDED = {
    "silu_after_3x3": ((0.07, -4), F.silu, (0.03, -10)),
    "gate": ((0.05, 2), F.hardsigmoid, (1 / 256, -128)),
    "silu_before_add": ((0.05, 2), F.silu, (0.03, -10)),
}


class Tables(Int8Convs):
    """Three lookups that fold and two near misses, in a chain."""

    def __init__(self):
        super().__init__(seed=7)

    def forward(self, x):
        def lut(name, source):
            (s, z), f, (s2, z2) = FOLDED[name]
            return q(f(dq(source, s, z)), s2, z2)

        qa = q(x, 0.05, 3)
        # EfficientNet's conv -> silu -> folds
        s1 = lut("silu_after_3x3", q(self.conv(dq(qa, 0.05, 3), "w3", padding=1), 0.07, -4))
        # a squeeze-and-excite gate's conv -> hardsigmoid -> folds
        g2 = lut("gate", q(self.conv(dq(s1, 0.03, -10), "w1"), 0.05, 2))
        # YOLO's bottleneck, conv -> silu -> add: the lookup folds, the add stays
        s3 = lut("silu_before_add", q(self.conv(dq(g2, 1 / 256, -128), "w1"), 0.05, 2))
        r3 = q(dq(s3, 0.03, -10) + dq(s1, 0.03, -10), 0.06, 0)
        # conv -> add (fused into the conv as its residual) -> silu: stays a lookup
        c4 = q(self.conv(dq(r3, 0.06, 0), "w1"), 0.05, 2)
        r4 = q(dq(c4, 0.05, 2) + dq(r3, 0.06, 0), 0.07, 1)
        s4 = q(F.silu(dq(r4, 0.07, 1)), 0.03, -10)
        # the conv's output also read by a max pool: stays a lookup
        c5 = q(self.conv(dq(s4, 0.03, -10), "w1"), 0.05, 2)
        s5 = q(torch.tanh(dq(c5, 0.05, 2)), 0.008, 0)
        p5 = q(F.max_pool2d(dq(c5, 0.05, 2), 3, 1, 1), 0.05, 2)
        return dq(s5, 0.008, 0), dq(p5, 0.05, 2)


def _inputs(seed: int):
    return (torch.randn(2, 6, 9, 11, generator=torch.Generator().manual_seed(seed)) * 2,)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lower_and_save(Tables(), _inputs(0), tmp_path_factory.mktemp("conv_luts"))


def test_the_lookups_that_may_fold_go_into_their_convs(lowered):
    _, program, _ = lowered
    targets = Counter(n.target for n in program.nodes)
    assert (targets[CONV], targets[LUT], targets[ADD]) == (5, 2, 1)
    convs = [n for n in program.nodes if n.target == CONV]
    folded = [n for n in convs if len(n.args) == 24 and n.args[23] is not None]
    assert len(folded) == 3
    for conv in folded:
        assert isinstance(conv.args[23], Const) and conv.args[17:23] == NO_RESIDUAL
        assert program.values[conv.outputs[0]].layout == "PACKED_INT8_CONV2D"
    tables = sorted(program.constants[n.args[23].name].tolist() for n in folded)
    assert tables == sorted(q(f(dq(INT8, s, z)), s2, z2).tolist() for (s, z), f, (s2, z2) in FOLDED.values())
    # the near misses: a conv with a residual, and one whose output a max pool reads too
    producers = program.producers()
    kept = [producers[n.args[0].name] for n in program.nodes if n.target == LUT]
    assert [n.target for n in kept] == [CONV, CONV]
    assert kept[0].args[17] is not None and len(kept[1].args) == 15
    # the add after the folded silu reads the folded conv's output
    add = next(n for n in program.nodes if n.target == ADD)
    assert producers[add.args[0].name] in folded


def test_placement_and_bit_exact_device_runs(lowered):
    _, program, path = lowered
    check_device_runs(path, program, _inputs)


def test_the_folded_program_computes_what_the_lookups_did(lowered, monkeypatch):
    """The same graph lowered without the fold gives the same values, bit for bit, on the
    device and in the reference."""
    exported, program, path = lowered
    from runtime.programs import lower_conv_lut

    monkeypatch.setattr(lower_conv_lut, "fold_lookup_tables", lambda rw: None)
    unfolded = runtime.lower(exported)
    assert [n.target for n in unfolded.nodes].count(LUT) == 5
    loaded = runtime.load(path)
    inputs = _inputs(3)
    for got, want, reference in zip(loaded(*inputs), unfolded.run_reference(*inputs),
                                    program.run_reference(*inputs), strict=True):
        assert torch.equal(got, want) and torch.equal(reference, want)
