"""Fused projections split into one quantized linear per slice (runtime/programs/split_linears.py).

Small modules with one 8da4w linear (with a bias, as fused qkv projections of some models have)
whose output is sliced along its last dimension the ways models do it (``y[..., a:b]``,
``chunk``, ``split`` by size and by sizes, one range read twice, slices that overlap) are
exported, lowered, saved and loaded: every slice is a linear of its own on the device, and the
outputs equal, bit for bit, PyTorch's run of the fused program (FuseQuantizedOps' output, whose
etvk ops run their reference kernels) that slices the fused linear's output on the CPU. Outputs
that other readers also need, or other slices (steps, another dimension, no rows), leave the
linear whole, with its slices on the CPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

import runtime
from runtime.pytorch.passes import fuse_quantized_ops
from runtime.tools import llm_models

K, N = 64, 72
LINEAR = "etvk.linear_qta8a_qga4w.default"
SLICES = {"aten.slice.Tensor", "aten.chunk.default", "aten.split.Tensor", "aten.split_with_sizes.default"}


class Fused(torch.nn.Module):
    """One linear [K -> N] with a bias, its output read by `read`."""

    def __init__(self, read):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.fc = torch.nn.Linear(K, N)
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5
        self.read = read

    def forward(self, x):
        return self.read(self.fc(x))


def qkv(y):
    """Phi-3's q, k, v: slices of 32, 24 and the rest (16 rows)."""
    return y[..., :32], y[..., 32:56], y[..., 56:]


SPLIT = {
    "slices": (qkv, [(0, 32), (32, 56), (56, 72)]),
    "chunk": (lambda y: y.chunk(2, dim=-1), [(0, 36), (36, 72)]),  # Phi-3's gate and up
    "split_by_size": (lambda y: torch.split(y, 32, dim=-1), [(0, 32), (32, 64), (64, 72)]),
    "split_by_sizes_one_read": (lambda y: torch.split(y, [8, 60, 4], dim=-1)[1] * 2.0, [(8, 68)]),
    "a_chunk_and_a_slice_alike": (lambda y: (y.chunk(2, -1)[0] + 1.0, y[..., :36] * 3.0), [(0, 36)]),
    "overlapping_slices": (lambda y: (y[..., :40], y[..., 24:]), [(0, 40), (24, 72)]),
}


def lowered(read, tokens=3):
    model = llm_models.quantize_8da4w(Fused(read).eval())
    x = torch.randn(1, tokens, K, generator=torch.Generator().manual_seed(tokens))
    exported = torch.export.export(model, (x,))
    return exported, runtime.lower(exported), x


def row_ranges(program):
    """(start, end) of every linear's rows in the fused weight, from its constants' names."""
    ranges = []
    for node in program.nodes:
        if node.target == LINEAR:
            _, start, end = node.args[3].name.rsplit("_", 2)
            ranges.append((int(start), int(end)))
    return sorted(ranges)


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("case", sorted(SPLIT))
def test_every_slice_is_a_linear_on_the_device(case, tokens, tmp_path):
    read, rows = SPLIT[case]
    exported, program, x = lowered(read, tokens)
    targets = [n.target for n in program.nodes]
    assert not SLICES & set(targets), targets
    assert row_ranges(program) == rows
    # the pieces share the one per-token quantize of the input
    assert targets.count("etvk.quantize_affine_per_token_dynamic.default") == 1
    assert len({n.args[0] for n in program.nodes if n.target == LINEAR}) == 1
    program.save(tmp_path / "fused.etvk")
    loaded = runtime.load(tmp_path / "fused.etvk")
    assert [r["node"] for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    got = loaded(x)
    want = fuse_quantized_ops(exported).module()(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


KEPT = {
    "read_whole_too": (lambda y: (y[..., :8], y.sum(-1)), "reads its output"),
    "returned_whole": (lambda y: (y, y[..., :8]), "the program returns its output"),
    "steps": (lambda y: y[..., ::2], "slices another dimension than the last, or steps"),
    "another_dimension": (lambda y: y[:, 1:], "slices another dimension than the last, or steps"),
    "no_rows": (lambda y: (y[..., 8:8], y[..., :8]), "takes no rows"),
}


@pytest.mark.parametrize("case", sorted(KEPT))
def test_other_reads_keep_the_linear_whole(case, caplog):
    read, reason = KEPT[case]
    with caplog.at_level(logging.DEBUG, logger="runtime.programs.split_linears"):
        _, program, _ = lowered(read)
    assert [n for n in program.nodes if n.target == LINEAR][0].args[3].name.endswith("_packed")
    assert sum(n.target == LINEAR for n in program.nodes) == 1
    assert reason in caplog.text, caplog.text
