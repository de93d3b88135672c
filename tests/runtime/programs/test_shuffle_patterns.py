"""The channel split and shuffle patterns of runtime/programs/lower_gather.py (ShuffleNetV2) on a
graph written with explicit quantize / dequantize ops, as PT2E leaves them: chunk, cat and the
shuffle's view -> transpose -> contiguous -> view in fp32 between a dequantize and the next
quantize. Nothing of them stays on the CPU; device runs equal Program.run_reference bit for bit,
and the reference equals PyTorch's run of the graph. Near misses (no quantize after the fp32
values, a chunk of another dimension) stay on the CPU."""

from __future__ import annotations

from collections import Counter

import torch
from program_cases import QD, dq, q
from torch import nn
from torch.nn import functional as F

import runtime


def shuffle(x, groups):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


class Blocks(nn.Module):
    """Two ShuffleNetV2 stride-1 blocks (the second split taken from the first's shuffle), then a
    chunk requantized on its own, a slice and a shuffle of one dequantized tensor each quantized
    with its source's qparams, and a 3-group shuffle of a 3-way cat (21 channels, one a slice)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        for index in range(2):
            self.register_buffer(f"w{index}", torch.randint(-127, 128, (5, 5, 1, 1), generator=gen, dtype=torch.int8))
            self.register_buffer(f"s{index}", torch.rand(5, generator=gen) * 0.01 + 0.002)
        self.register_buffer("z", torch.zeros(5, dtype=torch.int64))

    def _conv(self, x, index, scale, zero_point):
        w, s = getattr(self, f"w{index}"), getattr(self, f"s{index}")
        w = QD.dequantize_per_channel(w, s, self.z, 0, -127, 127, torch.int8)
        return q(F.relu(F.conv2d(x, w)), scale, zero_point)

    def forward(self, x):
        qx = q(x, 0.05, 3)
        x1, x2 = dq(qx, 0.05, 3).chunk(2, dim=1)
        branch = self._conv(dq(q(x2, 0.04, -2), 0.04, -2), 0, 0.03, -128)
        out = shuffle(torch.cat((x1, dq(branch, 0.03, -128)), dim=1), 2)
        y1, y2 = out.chunk(2, dim=1)
        branch = self._conv(dq(q(y2, 0.035, 1), 0.035, 1), 1, 0.02, -128)
        block = q(shuffle(torch.cat((y1, dq(branch, 0.02, -128)), dim=1), 2), 0.045, 0)
        half = q(dq(block, 0.045, 0).chunk(2, dim=1)[1], 0.06, 5)               # requantized
        sliced = q(dq(qx, 0.05, 3)[:, 3:9], 0.05, 3)                            # same qparams: a gather
        shuffled = q(shuffle(dq(qx, 0.05, 3), 5), 0.05, 3)
        wide = torch.cat((dq(qx, 0.05, 3), dq(block, 0.045, 0), dq(qx, 0.05, 3)[:, 1:2]), dim=1)
        three = q(shuffle(wide, 3), 0.07, -3)                                   # 10 + 10 + 1 channels
        return (dq(block, 0.045, 0), dq(half, 0.06, 5), dq(sliced, 0.05, 3), dq(shuffled, 0.05, 3),
                dq(three, 0.07, -3))


def _inputs(seed: int):
    return (torch.randn(2, 10, 5, 7, generator=torch.Generator().manual_seed(seed)),)


def test_shuffle_blocks_run_on_the_device_bit_exact(tmp_path):
    exported = torch.export.export(Blocks().eval(), _inputs(0))
    program = runtime.lower(exported)
    targets = Counter(n.target.removesuffix(".default") for n in program.nodes)
    assert not [t for t in targets if t.startswith("aten.")], targets
    assert targets["etvk.q8ta_channel_gather"] >= 6 and targets["etvk.q8ta_concat"] >= 3, targets
    program.save(tmp_path / "shuffle.etvk")
    loaded = runtime.load(tmp_path / "shuffle.etvk")
    assert {r["runs_on"] for r in loaded.placement()} == {"vulkan"}
    for seed in (1, 2):
        inputs = _inputs(seed)
        want = program.run_reference(*inputs)
        theirs = exported.module()(*inputs)
        for got, reference, pytorch in zip(loaded(*inputs), want, theirs, strict=True):
            assert torch.equal(got, reference)
            assert torch.equal(reference, pytorch)


class NearMisses(nn.Module):
    """What stays on the CPU: a shuffle returned in fp32 (no quantize to compute) and a chunk of
    the height; the quantized channel chunk beside them is lowered."""

    def forward(self, x):
        qx = q(x, 0.05, 3)
        returned = shuffle(dq(qx, 0.05, 3), 2)
        rows = q(dq(qx, 0.05, 3).chunk(2, dim=2)[0], 0.05, 3)
        channels = q(dq(qx, 0.05, 3).chunk(2, dim=1)[0], 0.05, 3)
        return returned, dq(rows, 0.05, 3), dq(channels, 0.05, 3)


def test_near_misses_stay_on_the_cpu():
    exported = torch.export.export(NearMisses().eval(), _inputs(0))
    program = runtime.lower(exported)
    targets = Counter(n.target.removesuffix(".default") for n in program.nodes)
    assert targets["aten.transpose.int"] == 1 and targets["aten.chunk"] == 1, targets
    gathers = [n for n in program.nodes if n.target == "etvk.q8ta_channel_gather.default"]
    assert [n.args[1:] for n in gathers] == [(0, 5, 1)]
    inputs = _inputs(3)
    for reference, pytorch in zip(program.run_reference(*inputs), exported.module()(*inputs), strict=True):
        assert torch.equal(reference, pytorch)
