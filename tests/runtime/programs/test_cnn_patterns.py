"""The int8 CNN patterns of runtime/programs/lower_cnn.py on a graph written with explicit
quantize / dequantize ops (no quantizer, so each pattern and each near miss is there on
purpose): what is lowered, what stays on the CPU and why, bit-exact device runs, and
agreement with PyTorch's own run of the same graph."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import QD, check_agreement, dq, lower_and_save, maps_and_gate, q
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.programs.nodes import Const, Ref


class Patterns(nn.Module):
    """Every pattern once, a max pool whose qparams change (pooled in int8, then requantized) and a
    clamp whose qparams change (no conv activation: a lookup table, lower_lut.py)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.register_buffer("conv_w", torch.randint(-127, 128, (6, 6, 3, 3), generator=gen, dtype=torch.int8))
        self.register_buffer("conv_s", torch.rand(6, generator=gen) * 0.01 + 0.002)
        self.register_buffer("lin_w", torch.randint(-127, 128, (5, 18), generator=gen, dtype=torch.int8))
        self.register_buffer("lin_s", torch.rand(5, generator=gen) * 0.01 + 0.002)
        self.register_buffer("lin_b", torch.randn(5, generator=gen))
        self.register_buffer("conv_z", torch.zeros(6, dtype=torch.int64))
        self.register_buffer("lin_z", torch.zeros(5, dtype=torch.int64))

    def _weight(self, name):
        w, s, z = (getattr(self, f"{name}_{k}") for k in "wsz")
        return QD.dequantize_per_channel(w, s, z, 0, -127, 127, torch.int8)

    def forward(self, x, y, g):
        qa, qb, qg = q(x, 0.05, 3), q(y, 0.04, -1), q(g, 0.02, 0)
        conv = q(F.conv2d(dq(qa, 0.05, 3), self._weight("conv"), padding=1), 0.07, -4)
        relu6 = q(F.hardtanh(dq(conv, 0.07, -4), -1.0, 2.0), 0.07, -4)         # folds into the conv
        clamp = q(F.hardtanh(dq(relu6, 0.07, -4), -0.5, 0.5), 0.01, 0)         # new qparams: a LUT
        added = q(F.relu(dq(relu6, 0.07, -4) + dq(qb, 0.04, -1)), 0.06, -128)
        gated = q(dq(qg, 0.02, 0) * dq(added, 0.06, -128), 0.03, 5)            # [N, C, 1, 1] first
        cat = q(torch.cat([dq(added, 0.06, -128), dq(gated, 0.03, 5), dq(qa, 0.05, 3)], 1), 0.05, 0)
        avg = q(F.avg_pool2d(dq(cat, 0.05, 0), 3, 2, 1, ceil_mode=True, count_include_pad=False), 0.04, 1)
        pooled = q(F.max_pool2d(dq(avg, 0.04, 1), 2, 2), 0.04, 1)
        other = q(F.max_pool2d(dq(avg, 0.04, 1), 2, 2), 0.05, 1)              # new qparams: requantized
        mean = q(dq(pooled, 0.04, 1).mean(dim=[-1, -2], keepdim=True), 0.03, 2)
        flat = q(dq(mean, 0.03, 2).flatten(1), 0.03, 2)
        kept = q(F.dropout(dq(flat, 0.03, 2), 0.2, False), 0.03, 2)
        logits = F.linear(dq(kept, 0.03, 2), self._weight("lin"), self.lin_b)
        return logits, dq(other, 0.05, 1), dq(clamp, 0.01, 0)


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lower_and_save(Patterns(), maps_and_gate(0), tmp_path_factory.mktemp("patterns"))


def test_each_pattern_becomes_its_op(lowered):
    _, program, _ = lowered
    targets = Counter(n.target.removesuffix(".default") for n in program.nodes)
    for op, count in {"etvk.q8ta_conv2d": 1, "etvk.q8ta_add": 1, "etvk.q8ta_mul": 1, "etvk.q8ta_concat": 2,
                      "etvk.q8ta_avg_pool2d": 1, "etvk.q8ta_max_pool2d": 1,
                      "etvk.q8ta_global_avg_pool2d": 1, "etvk.q8ta_linear": 1}.items():
        assert targets[op] == count, (op, targets)
    # the max pool with new qparams is requantized; dropout, the flatten and same-qparams round trips are gone
    assert not [t for t in targets if t.startswith("aten.")], targets
    assert targets["etvk.q8ta_lut"] == 1 and targets["etvk.q8ta_dequantize"] == 3, targets
    assert not [t for t in targets if "dropout" in t or "flatten" in t or t.startswith("quantized_decomposed")]
    conv = next(n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default")
    assert conv.args[14:] == ("hardtanh", -1.0, 2.0)
    add = next(n for n in program.nodes if n.target == "etvk.q8ta_add.default")
    assert add.args[8] == "relu"
    mul = next(n for n in program.nodes if n.target == "etvk.q8ta_mul.default")
    assert program.values[mul.args[3].name].shape == (2, 6, 1, 1)  # the broadcast operand second
    linear = next(n for n in program.nodes if n.target == "etvk.q8ta_linear.default")
    assert program.values[linear.args[0].name].shape == (2, 18, 1, 1)  # the pooled tensor, read in place
    assert linear.args[7] is None and isinstance(linear.args[3], Const)  # no quantize after it: fp32 out
    packed = [n for n, spec in program.values.items() if spec.layout is not None]
    assert linear.args[0].name in packed and all(n.outputs[0] in packed for n in program.nodes
                                                 if n.target == "etvk.q8ta_concat.default")


def test_placement_and_bit_exact_device_runs(lowered):
    _, program, path = lowered
    loaded = runtime.load(path)
    for row in loaded.placement():
        if row["target"].startswith("etvk."):
            assert row["runs_on"] == "vulkan", row
        else:
            assert row["runs_on"] == "cpu" and row["reason"] == f"no generated op for {row['target']}"
    for seed in (1, 2):
        inputs = maps_and_gate(seed)
        for got, want in zip(loaded(*inputs), program.run_reference(*inputs), strict=True):
            assert torch.equal(got, want)


def test_agreement_with_pytorch(lowered, capsys):
    exported, program, _ = lowered
    check_agreement("patterns", exported, program, maps_and_gate(5), capsys)


class DirectActivations(nn.Module):
    """Activations between a conv and its output quantize (a quantizer that fuses them)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(4)
        self.register_buffer("w", torch.randint(-127, 128, (8, 6, 3, 3), generator=gen, dtype=torch.int8))
        self.register_buffer("s", torch.rand(8, generator=gen) * 0.01 + 0.002)
        self.register_buffer("z", torch.zeros(8, dtype=torch.int64))

    def forward(self, x, y, g):
        w = QD.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, torch.int8)
        a = dq(q(x, 0.05, 3), 0.05, 3)
        swish = q(F.hardswish(F.conv2d(a, w, padding=1)), 0.06, -100)
        clamp = q(F.hardtanh(F.conv2d(a, w), -2.0, 3.0), 0.03, 0)
        return dq(swish, 0.06, -100), dq(clamp, 0.03, 0)


def test_activations_between_a_conv_and_its_quantize(tmp_path):
    exported = torch.export.export(DirectActivations().eval(), maps_and_gate(0))
    program = runtime.lower(exported)
    convs = [n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default"]
    assert [c.args[14:] for c in convs] == [("hardswish",), ("hardtanh", -2.0, 3.0)]
    program.save(tmp_path / "act.etvk")
    loaded = runtime.load(tmp_path / "act.etvk")
    assert {r["runs_on"] for r in loaded.placement()} == {"vulkan"}
    inputs = maps_and_gate(3)
    for got, want, theirs in zip(loaded(*inputs), program.run_reference(*inputs), exported.module()(*inputs),
                                 strict=True):
        assert torch.equal(got, want)
        # one step of the output scale at most (hardswish: PyTorch divides by 6, we multiply by fp32(1/6))
        assert float((got - theirs).abs().max()) <= 0.06 + 1e-6


class Head(nn.Module):
    """A classifier head: ``mean`` over H and W (kept and flattened, or not kept) read by a linear,
    through a dropout quantized on its own where asked, and the pooled ``[N, C]`` also returned
    where asked."""

    def __init__(self, dims, keepdim, returned, dropout):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.register_buffer("w", torch.randint(-127, 128, (5, 6), generator=gen, dtype=torch.int8))
        self.register_buffer("s", torch.rand(5, generator=gen) * 0.01 + 0.002)
        self.register_buffer("z", torch.zeros(5, dtype=torch.int64))
        self.register_buffer("b", torch.randn(5, generator=gen))
        self.dims, self.keepdim, self.returned, self.dropout = dims, keepdim, returned, dropout

    def forward(self, x):
        pooled = q(dq(q(x, 0.05, 3), 0.05, 3).mean(dim=self.dims, keepdim=self.keepdim), 0.03, 2)
        if self.keepdim:
            pooled = q(dq(pooled, 0.03, 2).flatten(1), 0.03, 2)
        rows = (q(F.dropout(dq(pooled, 0.03, 2), 0.2, False), 0.02, -1), 0.02, -1) if self.dropout \
            else (pooled, 0.03, 2)
        w = QD.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, torch.int8)
        logits = F.linear(dq(*rows), w, self.b)
        return (logits, dq(pooled, 0.03, 2)) if self.returned else (logits,)


def _head(dims, keepdim, returned, dropout, x):
    exported = torch.export.export(Head(dims, keepdim, returned, dropout).eval(), (x,))
    return exported, runtime.lower(exported)


# (dims, keepdim, the pooled [N, C] returned too, a dropout with its own qparams): every spelling
# of H and W, both keepdim forms
HEADS = [([2, 3], True, False, False), ([-2, -1], True, False, False), ([2, 3], False, False, False),
         ([-1, -2], False, False, False), ([-2, 3], False, False, False), ([2, 3], True, True, False),
         ([-2, -1], False, True, False), ([2, 3], True, False, True), ([-1, -2], False, False, True),
         ([2, 3], False, True, True)]


@pytest.mark.parametrize("dims, keepdim, returned, dropout", HEADS, ids=[
    f"{d}-keepdim={k}-returned={r}-dropout={o}".replace(" ", "") for d, k, r, o in HEADS])
def test_a_mean_over_h_and_w_is_a_global_pool_the_linear_reads_in_place(dims, keepdim, returned, dropout,
                                                                         tmp_path):
    x = maps_and_gate(6)[0]
    exported, program = _head(dims, keepdim, returned, dropout, x)
    assert not [n for n in program.nodes if n.target == "aten.mean.dim"]
    pool, linear = (next(n for n in program.nodes if n.target == f"etvk.q8ta_{op}.default")
                    for op in ("global_avg_pool2d", "linear"))
    read = program.producers()[linear.args[0].name]
    assert program.values[read.outputs[0]].shape == (2, 6, 1, 1)
    if dropout:  # the dropout's quantize: the pooled tensor requantized, packed
        assert (read.target, read.args[1:3]) == ("etvk.q8ta_quantize.default", (0.02, -1))
        read = program.producers()[read.args[0].name]
        assert read.target == "etvk.q8ta_dequantize.default" and read.args[0] == Ref(pool.outputs[0])
    else:
        assert read is pool
    program.save(tmp_path / "head.etvk")
    loaded = runtime.load(tmp_path / "head.etvk")
    # a returned [N, C] is the pooled [N, C, 1, 1] flattened: a view on the device
    assert [r["target"] for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    assert [r["op"] for r in loaded.placement() if r["target"] == "aten.flatten.using_ints"] == \
        (["aten.flatten.using_ints"] if returned else [])
    got = loaded(x)
    kept = _head([2, 3], True, returned, dropout, x)[1].run_reference(x)
    for ours, reference, kept_form in zip(got, program.run_reference(x), kept, strict=True):
        assert torch.equal(ours, reference) and torch.equal(ours, kept_form)  # each spelling: one result
    if returned:  # the pooled values: at most one step (0.03) from PyTorch's
        assert float((got[1] - exported.module()(x)[1]).abs().max()) <= 0.03 + 1e-6
