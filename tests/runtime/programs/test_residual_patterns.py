"""Residual adds fused into the conv that produces one of their operands
(runtime/programs/lower_residual.py), on a graph written with explicit quantize / dequantize
ops: each fusion and each near miss is there on purpose. Which adds fuse and with what, bit-exact
device runs, and agreement with PyTorch's own run of the same graph."""

from __future__ import annotations

import pytest
import torch
from program_cases import (
    Int8Convs,
    check_agreement,
    check_device_runs,
    dq,
    lower_and_save,
    maps_and_gate,
    q,
)
from torch.nn import functional as F

import runtime
from runtime.programs.layouts import resolve_layouts
from runtime.programs.nodes import Ref
from runtime.vulkan.device import GPU_FAMILIES

CONV, ADD = "etvk.q8ta_conv2d.default", "etvk.q8ta_add.default"


class Residuals(Int8Convs):
    """Three adds that fuse and four near misses, in a chain."""

    def __init__(self):
        super().__init__(seed=6)

    def forward(self, x, y, g):
        qa, qb, qg = q(x, 0.05, 3), q(y, 0.04, -1), q(g, 0.02, 0)
        # ResNet's block: conv output first, relu after -> fused, residual qb
        c1 = q(self.conv(dq(qa, 0.05, 3), "w3", padding=1), 0.07, -4)
        r1 = q(F.relu(dq(c1, 0.07, -4) + dq(qb, 0.04, -1)), 0.06, -128)
        # MobileNetV2's: the earlier tensor first, no relu -> fused, residual r1
        c2 = q(self.conv(dq(r1, 0.06, -128), "w1"), 0.05, 2)
        r2 = q(dq(r1, 0.06, -128) + dq(c2, 0.05, 2), 0.08, 0)
        # the other operand is written after the conv: stays an add
        c3 = q(self.conv(dq(r2, 0.08, 0), "w1"), 0.05, 2)
        late = q(F.max_pool2d(dq(r2, 0.08, 0), 3, 1, 1), 0.08, 0)
        r3 = q(dq(c3, 0.05, 2) + dq(late, 0.08, 0), 0.07, 1)
        # the other operand is [N, C, 1, 1] (broadcast): stays an add
        c4 = q(self.conv(dq(r3, 0.07, 1), "w1"), 0.05, 2)
        r4 = q(dq(c4, 0.05, 2) + dq(qg, 0.02, 0), 0.07, 1)
        # the conv's output is also a program output: stays an add
        c5 = q(self.conv(dq(r4, 0.07, 1), "w1"), 0.05, 2)
        r5 = q(dq(c5, 0.05, 2) + dq(r4, 0.07, 1), 0.07, 1)
        # ResNet's downsample: two convs, the later one takes the earlier one's output -> fused
        c6 = q(self.conv(dq(r5, 0.07, 1), "w1"), 0.05, 2)
        c7 = q(self.conv(dq(r5, 0.07, 1), "w3", padding=1), 0.06, 1)
        r6 = q(F.relu(dq(c6, 0.05, 2) + dq(c7, 0.06, 1)), 0.09, -128)
        # the add dequantizes the conv's output with other qparams than the conv's: stays an add
        c8 = q(self.conv(dq(r6, 0.09, -128), "w1"), 0.05, 2)
        r7 = q(dq(c8, 0.06, 2) + dq(r6, 0.09, -128), 0.07, 1)
        return dq(r7, 0.07, 1), dq(c5, 0.05, 2)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lower_and_save(Residuals(), maps_and_gate(0), tmp_path_factory.mktemp("residuals"))


def test_the_adds_that_may_fuse_go_into_their_convs(lowered):
    _, program, _ = lowered
    producers = program.producers()
    convs = [n for n in program.nodes if n.target == CONV]
    assert len(convs) == 8
    fused = {n.name: n.args[17:] for n in convs if len(n.args) > 17}
    made = {name: producers[args[0].name].target for name, args in fused.items()}
    assert len(fused) == 3 and [n.target for n in program.nodes].count(ADD) == 4
    by_residual_scale = {args[1:]: made[name] for name, args in fused.items()}
    assert by_residual_scale == {
        (0.04, -1, 0.06, -128, "relu"): "etvk.q8ta_quantize.default",  # qb
        (0.06, -128, 0.08, 0, "none"): CONV,                            # r1, the first fused conv
        (0.05, 2, 0.09, -128, "relu"): CONV,                            # c6
    }
    for name, args in fused.items():  # the residual is written before its conv
        conv = next(n for n in convs if n.name == name)
        assert program.nodes.index(producers[args[0].name]) < program.nodes.index(conv)
        assert conv.args[14:17] == ("none", 0.0, 6.0)
    for add in (n for n in program.nodes if n.target == ADD):  # the near misses
        assert any(producers[a.name].target == CONV for a in (add.args[0], add.args[3]) if isinstance(a, Ref))
    # the residual, input and output of a fused conv are packed, in one layout on every family
    packed = {n for n, spec in program.values.items() if spec.layout is not None}
    assert all(args[0].name in packed for args in fused.values())
    for family in GPU_FAMILIES:
        resolved = resolve_layouts(program, family)
        for conv in (n for n in resolved.nodes if n.name in fused):
            names = (conv.args[0].name, conv.args[17].name, conv.outputs[0])
            assert len({resolved.values[n].layout for n in names}) == 1, (family, conv.name)


def test_placement_and_bit_exact_device_runs(lowered):
    _, program, path = lowered
    check_device_runs(path, program, maps_and_gate)


def test_the_fused_program_computes_what_the_adds_did(lowered, monkeypatch):
    """The same graph lowered without the fusion gives the same values, bit for bit."""
    exported, program, _ = lowered
    from runtime.programs import lower_residual

    monkeypatch.setattr(lower_residual, "fuse_residual_adds", lambda rw: None)
    unfused = runtime.lower(exported)
    assert [n.target for n in unfused.nodes].count(ADD) == 7
    inputs = maps_and_gate(3)
    for got, want in zip(program.run_reference(*inputs), unfused.run_reference(*inputs), strict=True):
        assert torch.equal(got, want)


def test_agreement_with_pytorch(lowered, capsys):
    exported, program, _ = lowered
    check_agreement("residuals", exported, program, maps_and_gate(5), capsys)
