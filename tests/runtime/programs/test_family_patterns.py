"""The patterns of torchvision's SqueezeNet, GoogLeNet, Inception-v3, VGG and AlexNet that PT2E
leaves in fp32, on a graph written with explicit quantize / dequantize ops: a max or average pool
of a cat of int8 tensors with different qparams (lower_gather.py pools after the cat's
requantization, or pushes an average pool into the cat), a pool of a cat inside a cat, and a classifier linear whose fp32 output goes through a relu or a
hardtanh before its quantize (a table of the linear's int8 output, lower_cnn.py and lower_lut.py).
Nothing of them stays on the CPU but the near miss, an average pool of an average pool; device
runs equal Program.run_reference bit for bit, and the reference equals PyTorch's run of the graph
(the average pools: one step apart at most, at rounding ties). DenseNet's layers likewise, their
transition pool through tables over its window sums, and the claim those tables rest on."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import QD, dq, q, sqnr_db
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.programs.lower_lut import pooled


class Blocks(nn.Module):
    """SqueezeNet's fire output pooled, Inception-v3's pool branch and its grid reduction (a max
    pool of the block's cat inside the next cat), a near miss, and VGG's classifier clamps."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.register_buffer("w", torch.randint(-127, 128, (6, 12), generator=gen, dtype=torch.int8))
        self.register_buffer("s", torch.rand(6, generator=gen) * 0.01 + 0.002)
        self.register_buffer("z", torch.zeros(6, dtype=torch.int64))
        self.register_buffer("b", torch.randn(6, generator=gen))

    def forward(self, x, y, z, rows):
        a, b, c = q(x, 0.05, 3), q(y, 0.03, -7), q(z, 0.04, 0)
        block = torch.cat((dq(a, 0.05, 3), dq(b, 0.03, -7)), dim=1)                 # 9 channels
        fire = q(F.max_pool2d(block, 3, 2, ceil_mode=True), 0.045, -2)
        branch = q(F.avg_pool2d(block, 3, 1, 1), 0.02, 1)
        reduced = torch.cat((dq(c, 0.04, 0), F.max_pool2d(block, 3, 2)), dim=1)    # 5 + 9 channels
        grid = q(reduced, 0.05, -1)
        pooled = q(F.avg_pool2d(reduced, 3, 1, 1, count_include_pad=False), 0.03, 4)
        twice = q(F.avg_pool2d(F.avg_pool2d(block, 2, 1), 2, 1), 0.02, 0)          # stays on the CPU
        w = QD.dequantize_per_channel(self.w, self.s, self.z, 0, -127, 127, torch.int8)
        r = dq(q(rows, 0.05, 0), 0.05, 0)
        relu = q(F.relu(F.linear(r, w, self.b)), 0.04, -128)
        clamp = q(F.hardtanh(F.linear(r, w, self.b), -1.0, 0.5), 0.01, 20)
        return (dq(fire, 0.045, -2), dq(grid, 0.05, -1), dq(relu, 0.04, -128), dq(clamp, 0.01, 20),
                dq(branch, 0.02, 1), dq(pooled, 0.03, 4), dq(twice, 0.02, 0))


EXACT = 4  # the outputs without an average pool: equal to PyTorch's


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, 9, 11, generator=gen), torch.randn(2, 5, 9, 11, generator=gen),
            torch.randn(2, 5, 4, 5, generator=gen), torch.randn(3, 12, generator=gen) * 2)


def test_family_blocks_run_on_the_device_bit_exact(tmp_path):
    exported = torch.export.export(Blocks().eval(), _inputs(0))
    program = runtime.lower(exported)
    targets = Counter(n.target.removesuffix(".default") for n in program.nodes)
    # the near miss only, and the cat it reads
    assert {t: n for t, n in targets.items() if t.startswith("aten.")} == {"aten.avg_pool2d": 2, "aten.cat": 1}
    assert targets["etvk.q8ta_lut"] == 2 and targets["etvk.q8ta_linear"] == 2, targets
    # average pools pushed into the cats (and the max pool of a cat under one): one per source
    assert targets["etvk.q8ta_max_pool2d"] >= 3 and targets["etvk.q8ta_avg_pool2d"] >= 4, targets
    program.save(tmp_path / "families.etvk")
    loaded = runtime.load(tmp_path / "families.etvk")
    cpu = [r for r in loaded.placement() if r["runs_on"] != "vulkan"]
    assert sorted(r["target"] for r in cpu) == ["aten.avg_pool2d.default"] * 2 + ["aten.cat.default"], cpu
    for seed in (1, 2):
        inputs = _inputs(seed)
        want = program.run_reference(*inputs)
        theirs = exported.module()(*inputs)
        for index, (got, reference, pytorch) in enumerate(zip(loaded(*inputs), want, theirs, strict=True)):
            assert torch.equal(got, reference), index
            if index < EXACT:
                assert torch.equal(reference, pytorch), index
            else:
                step = {4: 0.02, 5: 0.03, 6: 0.02}[index]
                assert float((reference - pytorch).abs().max()) <= step * 1.001, index
                assert sqnr_db(reference, pytorch) >= 30, index


class Dense(nn.Module):
    """DenseNet's layers: batch norm -> relu -> quantize of one int8 tensor, of a cat of int8
    tensors with different qparams and of the cat grown by one more (its first concat reused), of
    a cat of a transition's average pool PT2E leaves in fp32 (2x2 stride 2: through tables over
    its window sums, the op's x holding the max pool alone) and a max pool, and of that pool
    alone (no x); the pool also quantized on its own (a q8ta_avg_pool2d); DenseNet's head (the global pool of the relu, flattened, then
    quantized) and a mean without keepdim; a near miss, a batch norm whose fp32 output is also
    returned; and an average pool with padding (its windows not all full: rounded to its input's
    qparams)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        for index, channels in enumerate((4, 9, 14, 9, 9, 5, 5, 5)):
            self.register_buffer(f"weight{index}", torch.randn(channels, generator=gen))
            self.register_buffer(f"bias{index}", torch.randn(channels, generator=gen))
            self.register_buffer(f"mean{index}", torch.randn(channels, generator=gen) * 0.3)
            self.register_buffer(f"var{index}", torch.rand(channels, generator=gen) + 0.5)

    def bn(self, x, index):
        mean, var, weight, bias = (getattr(self, f"{k}{index}") for k in ("mean", "var", "weight", "bias"))
        return F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)

    def forward(self, x, y, z):
        a, b, c = dq(q(x, 0.05, 3), 0.05, 3), dq(q(y, 0.03, -7), 0.03, -7), dq(q(z, 0.04, 0), 0.04, 0)
        first = q(F.relu(self.bn(a, 0)), 0.02, -128)
        second = q(F.relu(self.bn(torch.cat((a, b), 1), 1)), 0.025, -128)
        grown = torch.cat((a, b, c), 1)
        third = q(F.relu(self.bn(grown, 2)), 0.03, -128)
        pool = F.avg_pool2d(c, 2)                                                  # in fp32
        after = torch.cat((pool, F.max_pool2d(a, 2)), 1)
        fourth = q(F.relu(self.bn(after, 3)), 0.02, -128)
        alone = q(F.relu(self.bn(pool, 7)), 0.02, -128)
        head = q(F.adaptive_avg_pool2d(F.relu(self.bn(torch.cat((a, c), 1), 4)), 1).flatten(1), 0.01, -128)
        mean = q(F.relu(self.bn(b, 5)).mean((-1, -2)), 0.01, -128)
        near = self.bn(grown, 2)                                                   # stays on the CPU
        padded = q(F.relu(self.bn(F.avg_pool2d(b, 3, 2, 1), 6)), 0.02, -128)
        return (dq(first, 0.02, -128), dq(second, 0.025, -128), dq(third, 0.03, -128),
                dq(fourth, 0.02, -128), dq(head, 0.01, -128), dq(mean, 0.01, -128),
                dq(q(F.relu(near), 0.03, -128), 0.03, -128), near, dq(padded, 0.02, -128),
                dq(alone, 0.02, -128), dq(q(pool, 0.04, 0), 0.04, 0))


def _dense_inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, c, 8, 10, generator=gen) for c in (4, 5, 5))


def test_dense_layers_run_on_the_device_bit_exact(tmp_path):
    exported = torch.export.export(Dense().eval(), _dense_inputs(0))
    program = runtime.lower(exported)
    targets = Counter(n.target.removesuffix(".default") for n in program.nodes)
    # the near miss only: its batch norm, relu and the cat it reads
    assert {t: n for t, n in targets.items() if t.startswith("aten.")} == {
        "aten.cat": 1, "aten.batch_norm": 1, "aten.relu": 1}, targets
    assert targets["etvk.q8ta_channel_lut"] == 4 and targets["etvk.q8ta_channel_lut_mean"] == 2, targets
    # the grown cat reuses the first one's concat; the pooled channels join no concat; the second
    # and third layers' tables share their concats' dispatches (the head's concat stays alone)
    assert targets["etvk.q8ta_concat_channel_lut"] == 2 and targets["etvk.q8ta_concat"] == 1, targets
    # one avg pool for the padded pool's table, one for the pool's own quantize
    assert targets["etvk.q8ta_window_sum"] == 1 and targets["etvk.q8ta_avg_pool2d"] == 2, targets
    sums_tables = [n for n in program.nodes if n.target == "etvk.q8ta_channel_lut.default" and len(n.args) > 2]
    assert [program.values[n.args[0].name].shape[1] if n.args[0] else 0 for n in sums_tables] == [4, 0]
    program.save(tmp_path / "dense.etvk")
    loaded = runtime.load(tmp_path / "dense.etvk")
    cpu = sorted(r["target"] for r in loaded.placement() if r["runs_on"] != "vulkan")
    assert cpu == ["aten.batch_norm.default", "aten.cat.default", "aten.relu.default"], cpu
    for seed in (1, 2):
        inputs = _dense_inputs(seed)
        want = program.run_reference(*inputs)
        theirs = exported.module()(*inputs)
        for index, (got, reference, pytorch) in enumerate(zip(loaded(*inputs), want, theirs, strict=True)):
            assert torch.equal(got, reference), index
            if index in (8, 10):  # an average pool rounded to int8 by q8ta_avg_pool2d: a step of its own
                assert sqnr_db(reference, pytorch) >= 30, index
            else:  # the means (4, 5) too: their sums take PyTorch's order
                assert torch.equal(reference, pytorch), index


@pytest.mark.parametrize(("scale", "zero_point", "k"), [(0.05, 3, 2), (0.0371, -20, 2), (1 / 3, 0, 2),
                                                       (0.011968, -128, 2), (0.02, 5, 3)])
def test_a_table_over_window_sums_holds_pytorchs_pooled_values_to_the_sum_order(scale, zero_point, k):
    """What the window-sum tables assume, checked: PyTorch's pooled fp32 value of a k x k window
    is fp32((v_1 + ... + v_K) / K) over the rounded products v_i = fp32((q_i - zp) * scale), a
    function of the window's values, not of their sum S alone. The table entry for S (`pooled`:
    aten.avg_pool2d of one window of S) equals PyTorch's for that window, and for every other
    window of S lies within the rounding errors of the two evaluations, 2 (K + 1) * 255 * scale
    * 2^-24; about half the random windows give the entry exactly."""
    taps = k * k
    pool = ("avg_pool", None, ([k], [k], [0], False, True, None), None)
    values = pooled(pool, (scale, zero_point), 3, 2)
    assert values.shape == (1, 3, 255 * taps + 1, 1) and not values[0, 2].any()
    table = values[0, 0, :, 0]
    sums = torch.arange(-128 * taps, 127 * taps + 1)
    windows = torch.stack([torch.div(sums + j, taps, rounding_mode="floor") for j in range(taps)], 1)
    assert torch.equal(windows.sum(1), sums)
    own = F.avg_pool2d(QD.dequantize_per_tensor(windows.to(torch.int8).view(1, 1, -1, k), scale, zero_point,
                                                -128, 127, torch.int8), k, k)
    assert torch.equal(own.view(-1), table)
    x = torch.randint(-128, 128, (1, 1, 300 * k, 300 * k), generator=torch.Generator().manual_seed(taps),
                      dtype=torch.int8)
    theirs = F.avg_pool2d(QD.dequantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8), k, k)
    window_sums = F.avg_pool2d(x.double(), k, k, divisor_override=1).round().long()
    ours = table[window_sums + 128 * taps]
    assert float((ours - theirs).abs().max()) <= 2 * (taps + 1) * 255 * scale * 2.0**-24
    assert 0.2 < float((ours == theirs).double().mean()) < 1  # the claim holds for most, not all
