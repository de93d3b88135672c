"""Lookup-table activations (runtime/programs/lower_lut.py): ``dq -> elementwise ops -> q`` on
an int8 tensor becomes one ``etvk.q8ta_lut``. On a graph written with explicit quantize /
dequantize ops (each pattern and each near miss on purpose), on a small CNN and on
MobileNetV3-Small and EfficientNet-B0 quantized with PT2E: what is lowered, what stays on
the CPU, tables equal to PyTorch's decomposed path, bit-exact device runs, agreement with
PyTorch; on the PT2E models, which lookups fold into the conv before them
(runtime/programs/lower_conv_lut.py) and that the folded program computes the unfolded one's
values."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import (
    Int8Convs,
    check_device_runs,
    dq,
    int8_agreement,
    lower_and_save,
    maps_and_gate,
    q,
    random_batches,
    sqnr_db,
)
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.programs.nodes import Const

LUT = "etvk.q8ta_lut.default"
PAIR = "etvk.q8ta_conv2d_pw_pair.default"
INT8 = torch.arange(-128, 128, dtype=torch.int8)


# output -> (input qparams, f, output qparams): each lowered pattern, as PyTorch computes it
CHAINS = {
    "hardswish": ((0.05, 3), F.hardswish, (0.03, -100)),
    "chain": ((0.03, -100), lambda r: torch.tanh(F.silu(r) * 0.5 + 1.0), (0.008, 0)),
    "swish_dag": ((0.008, 0), lambda r: r * torch.sigmoid(r), (0.004, -20)),
    "clamp": ((0.05, 3), lambda r: F.hardtanh(r, -0.5, 0.5), (0.004, 0)),
    "gate": ((0.02, 0), F.hardsigmoid, (1 / 256, -128)),
    "rows": ((0.04, -9), F.gelu, (0.02, -50)),
}


class Chains(nn.Module):
    """Every pattern kind once (a packed tensor, a chain with scalars, a DAG of one variable, a
    clamp whose qparams change, an SE gate [N, C, 1, 1], plain 2-D rows), and four near misses:
    an intermediate that is also an output, a per-channel constant, a softmax, and a dequantize
    of a program input."""

    def __init__(self):
        super().__init__()
        self.register_buffer("per_channel", torch.linspace(0.5, 1.5, 6).reshape(6, 1, 1))

    def forward(self, x, g, rows, int8_input):
        def lut(name, source):
            (s, z), f, (s2, z2) = CHAINS[name]
            return q(f(dq(source, s, z)), s2, z2)

        qa = q(x, 0.05, 3)
        swish = lut("hardswish", qa)
        chain = lut("chain", swish)
        dag = lut("swish_dag", chain)
        clamp = lut("clamp", qa)
        gate = lut("gate", q(g, 0.02, 0))
        plain = lut("rows", q(rows, 0.04, -9))
        shared = torch.sigmoid(dq(swish, 0.03, -100))                        # also an output: stays
        near = q(shared, 1 / 256, -128)
        scaled = q(dq(qa, 0.05, 3) * self.per_channel, 0.05, 0)             # a tensor constant: stays
        soft = q(torch.softmax(dq(qa, 0.05, 3), 1), 1 / 256, -128)          # not elementwise: stays
        direct = q(F.hardswish(dq(int8_input, 0.05, 3)), 0.03, -100)        # x made by no node: stays
        return tuple(dq(t, *CHAINS[n][2]) for t, n in ((swish, "hardswish"), (chain, "chain"),
                                                        (dag, "swish_dag"), (clamp, "clamp"),
                                                        (gate, "gate"), (plain, "rows"))) + (
            shared, dq(near, 1 / 256, -128), dq(scaled, 0.05, 0), dq(soft, 1 / 256, -128),
            dq(direct, 0.03, -100))


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 6, 5, 7, generator=gen) * 2, torch.randn(2, 6, 1, 1, generator=gen),
            torch.randn(3, 10, generator=gen) * 2,
            torch.randint(-128, 128, (2, 6, 5, 7), generator=gen, dtype=torch.int8))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    return lower_and_save(Chains(), _inputs(0), tmp_path_factory.mktemp("lut"))


def test_each_pattern_becomes_one_lookup_table(lowered):
    _, program, _ = lowered
    luts = [n for n in program.nodes if n.target == LUT]
    assert len(luts) == len(CHAINS)
    targets = Counter(n.target for n in program.nodes)
    # the near misses keep their ops (the per-channel product becomes the float etvk.binary);
    # the patterns' ops are gone
    assert {t: c for t, c in targets.items() if t.startswith("aten.")} == {
        "aten.sigmoid.default": 1, "aten.softmax.int": 1, "aten.hardswish.default": 1}
    assert targets["etvk.binary.default"] == 1
    for lut in luts:
        x, out = (program.values[v] for v in (lut.args[0].name, lut.outputs[0]))
        assert isinstance(lut.args[1], Const) and x.shape == out.shape
        assert x.layout == out.layout == (None if len(x.shape) == 2 else "PACKED_INT8_CONV2D")


def test_tables_are_pytorchs_decomposed_path(lowered):
    """Each table holds q(f(dq(v))) for v = -128 .. 127, computed here with PyTorch directly."""
    _, program, _ = lowered
    tables = sorted((program.values[n.args[0].name].shape, program.constants[n.args[1].name].tolist())
                    for n in program.nodes if n.target == LUT)
    want = []
    for name, ((s, z), f, (s2, z2)) in CHAINS.items():
        shape = {"gate": (2, 6, 1, 1), "rows": (3, 10)}.get(name, (2, 6, 5, 7))
        want.append((shape, q(f(dq(INT8, s, z)), s2, z2).tolist()))
    assert tables == sorted(want)


def test_placement_and_bit_exact_device_runs(lowered):
    exported, program, path = lowered
    loaded = runtime.load(path)
    on_cpu = [r["target"] for r in loaded.placement() if r["runs_on"] == "cpu"]
    assert LUT not in on_cpu and all(not t.startswith("etvk.") for t in on_cpu)
    for seed in (1, 2):
        inputs = _inputs(seed)
        got, reference, theirs = loaded(*inputs), program.run_reference(*inputs), exported.module()(*inputs)
        for index, (ours, want, pytorch) in enumerate(zip(got, reference, theirs, strict=True)):
            assert torch.equal(ours, want), index
            # PyTorch's run: the same values (a table entry is what its kernel computes for that
            # value; its scalar tail loop may differ by one fp32 ulp, hence one step at most)
            step = CHAINS[list(CHAINS)[index]][2][0] if index < len(CHAINS) else 0
            assert float((ours - pytorch).abs().max()) <= step + 1e-6, index


class ConvActivationConv(nn.Module):
    """conv -> activation -> conv -> activation -> conv: XNNPACK's quantizer quantizes each conv's
    output and input, so each activation sits between a dequantize and a quantize (a LUT)."""

    def __init__(self, activation):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(c, 8, 3, padding=1) for c in (3, 8, 8))
        self.activation = activation

    def forward(self, x):
        for conv in self.convs[:-1]:
            x = self.activation(conv(x))
        return self.convs[-1](x)


def _lower_unfolded(exported):
    """`exported` lowered without folding lookups into convs (its q8ta_lut nodes kept)."""
    from runtime.programs import lower_conv_lut

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lower_conv_lut, "fold_lookup_tables", lambda rw: None)
        return runtime.lower(exported)


def _folded_convs(program) -> int:
    """How many convs of `program` apply a lookup table (the conv schema's last argument, lut; a
    pointwise pair's lut and lut2 count as its two convs')."""
    convs = [n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default" and len(n.args) == 24
             and n.args[23] is not None]
    pairs = [n.args[i] for n in program.nodes if n.target == PAIR for i in (10, 22)]  # lut, lut2
    return len(convs) + len([t for t in pairs if t is not None])


@pytest.mark.parametrize("activation", [F.hardswish, F.gelu, torch.sigmoid], ids=["hardswish", "gelu", "sigmoid"])
def test_pt2e_conv_activation_conv_runs_on_the_device(activation, tmp_path):
    """Both activations fold into the conv before them; the device run equals the reference,
    which equals the unfolded program's, whose every LUT equals PyTorch's int8 output."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    from runtime.tools.models import quantize_pt2e

    torch.manual_seed(0)
    shape = (1, 3, 12, 12)
    exported = quantize_pt2e(ConvActivationConv(activation), random_batches(1, shape)[0],
                             random_batches(3, shape, seed=1))
    program, unfolded = runtime.lower(exported), _lower_unfolded(exported)
    targets = Counter(n.target for n in program.nodes)
    assert targets[LUT] == 0 and targets["etvk.q8ta_conv2d.default"] == 3 and _folded_convs(program) == 2
    assert Counter(n.target for n in unfolded.nodes)[LUT] == 2
    program.save(tmp_path / "cnn.etvk")
    loaded = runtime.load(tmp_path / "cnn.etvk")
    assert [r["target"] for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    (x,) = random_batches(1, shape, seed=5)[0]
    got = loaded(x)
    assert torch.equal(got, program.run_reference(x)) and torch.equal(got, unfolded.run_reference(x))
    assert sqnr_db(got, exported.module()(x)) >= 30
    total, exact, worst = int8_agreement(exported, unfolded, (x,))[LUT]
    assert exact == total and worst == 0  # teacher-forced: each LUT equals PyTorch's int8 output


# model -> (its q8ta_lut nodes, those on plain rows, those folded into the conv before them):
# MobileNetV3-Small's hardswishes and the hardsigmoids of its squeeze-and-excite gates (the
# classifier's hardswish on plain rows, after a linear: the one not folded), EfficientNet-B0's
# silus and the sigmoids of its gates
SE_MODELS = {"mobilenet_v3_small": (19 + 9, 1, 19 + 9 - 1), "efficientnet_b0": (49 + 16, 0, 49 + 16)}
# model -> its squeeze-and-excite gates, each gate's two convs one q8ta_conv2d_pw_pair
SE_PAIRS = {"mobilenet_v3_small": 9, "efficientnet_b0": 16}


@pytest.mark.parametrize("name", list(SE_MODELS))
def test_squeeze_and_excite_models_run_on_the_device(name, tmp_path, capsys):
    """torchvision's MobileNetV3-Small and EfficientNet-B0 (random weights, 48x48): with their
    activations as LUTs no node runs on the CPU; every LUT after a conv folded into it;
    bit-exact against the reference run and the unfolded program's, and every LUT output and
    every global pool output of the unfolded program equal to PyTorch's (teacher-forced; the
    gates' pools sum in PyTorch's order, docs/int8_cnn_ops.md)."""
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    from runtime.tools.models import quantize_pt2e, torchvision_model, with_batch_statistics

    torch.manual_seed(0)
    shape = (1, 3, 48, 48)
    model = with_batch_statistics(torchvision_model(name), random_batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, random_batches(1, shape)[0], random_batches(2, shape, seed=1))
    program, unfolded = runtime.lower(exported), _lower_unfolded(exported)
    luts = [n for n in unfolded.nodes if n.target == LUT]
    plain = [n for n in luts if len(unfolded.values[n.args[0].name].shape) == 2]
    assert (len(luts), len(plain), _folded_convs(program)) == SE_MODELS[name]
    assert Counter(n.target for n in program.nodes)[LUT] == len(luts) - SE_MODELS[name][2]
    assert Counter(n.target for n in program.nodes)[PAIR] == SE_PAIRS[name]
    program.save(tmp_path / f"{name}.etvk")
    loaded = runtime.load(tmp_path / f"{name}.etvk")
    assert [r["target"] for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    (x,) = random_batches(1, shape, seed=7)[0]
    got = loaded(x)
    assert torch.equal(got, program.run_reference(x)) and torch.equal(got, unfolded.run_reference(x))
    found = int8_agreement(exported, unfolded, (x,))
    with capsys.disabled():
        print(f"\n{name} vs PyTorch, output SQNR {sqnr_db(got, exported.module()(x)):.1f} dB:")
        for target, (total, exact, worst) in sorted(found.items()):
            print(f"  {target}: {exact}/{total} ({100 * exact / total:.3f} %), worst {worst}")
    assert found[LUT][1] == found[LUT][0]
    pools = found["etvk.q8ta_global_avg_pool2d.default"]
    assert pools[1] == pools[0]


class FloatPooledGate(Int8Convs):
    """A squeeze-and-excite block and a classifier head as torch 2.11's PT2E graph of
    EfficientNet-B0 (silu, sigmoid) or MobileNetV3 (hardswish, hardsigmoid) has them: the
    activation of an int8 map is quantized for the gate's product alone, and the gate's pool
    reads it in fp32 (torch 2.13 quantizes it once for both); the head pools its activation
    the same way, its in-place dropout (train False) on the flattened pool kept in the graph.
    The gate's quantized pool is an output too."""

    def __init__(self, activation, gate):
        super().__init__(seed=3)
        self.activation, self.gate = activation, gate

    def forward(self, x):
        act = self.activation(dq(q(x, 0.05, 3), 0.05, 3), inplace=True)
        pooled = q(F.adaptive_avg_pool2d(act, 1), 0.004, -10)
        fc = q(self.conv(dq(pooled, 0.004, -10), "w1"), 0.01, 0)
        scale = q(self.gate(dq(fc, 0.01, 0)), 1 / 256, -128)
        y = q(dq(scale, 1 / 256, -128) * dq(q(act, 0.02, -90), 0.02, -90), 0.03, 0)
        head = self.activation(dq(y, 0.03, 0), inplace=True)
        flat = torch.ops.aten.dropout_.default(F.adaptive_avg_pool2d(head, 1).flatten(1), 0.2, False)
        return dq(pooled, 0.004, -10), dq(q(flat, 0.003, -20), 0.003, -20)


@pytest.mark.parametrize("activation, gate", [(F.silu, torch.sigmoid), (F.hardswish, F.hardsigmoid)],
                         ids=["silu", "hardswish"])
def test_a_gate_pooling_the_fp32_activation_runs_on_the_device(activation, gate, tmp_path):
    """The activation's quantize becomes a LUT and both pools of the fp32 activation one
    ``q8ta_channel_lut_mean`` each (one table row for every channel; the gate's written as the
    packed ``[N, C, 1, 1]`` map its conv reads): no node
    stays on the CPU, the device run equals the reference bit for bit, and both pools equal
    PyTorch's int8 values (the gate's on the program's own run too)."""
    exported, program, path = lower_and_save(FloatPooledGate(activation, gate), maps_and_gate(0)[:1], tmp_path)
    targets = Counter(n.target for n in program.nodes)
    assert targets["etvk.q8ta_channel_lut_mean.default"] == 2 and targets[LUT] >= 1, targets
    assert not [t for t in targets if t.startswith("aten.")], targets
    means = [n for n in program.nodes if n.target == "etvk.q8ta_channel_lut_mean.default"]
    assert [program.constants[n.args[1].name].shape for n in means] == [(1, 256)] * 2  # one row each
    gate_mean, head_mean = means
    readers = [n.target for n in program.nodes if gate_mean.outputs[0] in n.reads()]
    assert len(program.values[gate_mean.outputs[0]].shape) == 4 and "etvk.q8ta_conv2d.default" in readers, readers
    assert program.values[gate_mean.outputs[0]].layout is not None  # packed
    assert len(program.values[head_mean.outputs[0]].shape) == 2  # the head's rows
    check_device_runs(path, program, lambda seed: maps_and_gate(seed)[:1])
    loaded = runtime.load(path)
    for seed in (1, 2):
        inputs = maps_and_gate(seed)[:1]
        assert torch.equal(loaded(*inputs)[0], exported.module()(*inputs)[0])
        total, exact, _ = int8_agreement(exported, program, inputs)["etvk.q8ta_channel_lut_mean.default"]
        assert exact == total == 2 * 2 * 6  # both means, N 2, C 6
