"""Per-channel tables folded into the pointwise conv that reads them
(runtime/programs/lower_conv_in_table.py), on a DenseNet-like graph written with explicit
quantize / dequantize ops: each fold and each near miss is there on purpose. Which tables fold
and into what, bit-exact device runs, and the same values as the program lowered without the
fold."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from program_cases import QD, check_device_runs, dq, q
from torch import nn
from torch.nn import functional as F

import runtime
from runtime.programs import lower_conv_in_table
from runtime.programs.nodes import Const, Node
from runtime.programs.rewrite import Rewriter, bind, with_arguments

CONV, TABLES = "etvk.q8ta_conv2d.default", "etvk.q8ta_channel_lut.default"
# conv weight name -> (C_out, C_in, kernel)
WEIGHTS = {"fold": (8, 11, 1), "three": (6, 6, 3), "shared": (7, 5, 1), "both": (9, 14, 1), "pooled": (6, 11, 1)}


class DenseConvs(nn.Module):
    """DenseNet's layers, batch norm -> relu -> quantize -> 1x1 conv: on a cat of two int8 tensors
    with different qparams (folds), and on a cat of conv outputs into a conv whose output goes on
    through a lookup (folds; the conv then takes both tables); near misses: the tables read by a
    3x3 conv, read by a 1x1 conv and returned too, and over a cat holding an average pool PT2E
    leaves in fp32 (tables over its window sums)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        for name, (c_out, c_in, k) in WEIGHTS.items():
            self.register_buffer(f"{name}_w", torch.randint(-127, 128, (c_out, c_in, k, k), generator=gen,
                                                            dtype=torch.int8))
            self.register_buffer(f"{name}_s", torch.rand(c_out, generator=gen) * 0.01 + 0.002)
            self.register_buffer(f"{name}_z", torch.zeros(c_out, dtype=torch.int64))
        for index, channels in enumerate((11, 6, 5, 14, 11)):
            self.register_buffer(f"weight{index}", torch.randn(channels, generator=gen))
            self.register_buffer(f"bias{index}", torch.randn(channels, generator=gen))
            self.register_buffer(f"mean{index}", torch.randn(channels, generator=gen) * 0.3)
            self.register_buffer(f"var{index}", torch.rand(channels, generator=gen) + 0.5)

    def bn_relu(self, x, index, scale=0.02):
        mean, var, weight, bias = (getattr(self, f"{k}{index}") for k in ("mean", "var", "weight", "bias"))
        return q(F.relu(F.batch_norm(x, mean, var, weight, bias, False, 0.1, 1e-5)), scale, -128)

    def conv(self, x, name, scale, zero_point, **kwargs):
        w = QD.dequantize_per_channel(*(getattr(self, f"{name}_{k}") for k in "wsz"), 0, -127, 127, torch.int8)
        return q(F.conv2d(dq(x, 0.02, -128), w, **kwargs), scale, zero_point)

    def forward(self, x, y):
        a, b = dq(q(x, 0.05, 3), 0.05, 3), dq(q(y, 0.03, -7), 0.03, -7)
        fold = self.conv(self.bn_relu(torch.cat((a, b), 1), 0), "fold", 0.04, 1)
        three = self.conv(self.bn_relu(a, 1), "three", 0.05, 0, padding=1)
        shared_in = self.bn_relu(b, 2)
        shared = self.conv(shared_in, "shared", 0.05, 2)
        grown = torch.cat((dq(fold, 0.04, 1), dq(three, 0.05, 0)), 1)
        both = self.conv(self.bn_relu(grown, 3), "both", 0.05, 2)
        both = q(F.silu(dq(both, 0.05, 2)), 0.03, -10)
        pooled_cat = torch.cat((F.avg_pool2d(b, 2), F.max_pool2d(a, 2)), 1)
        pooled = self.conv(self.bn_relu(pooled_cat, 4), "pooled", 0.05, 0)
        return (dq(both, 0.03, -10), dq(shared, 0.05, 2), dq(shared_in, 0.02, -128), dq(pooled, 0.05, 0))


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 6, 8, 10, generator=gen), torch.randn(2, 5, 8, 10, generator=gen))


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """(exported, the program, its file, the program lowered without the fold)."""
    exported = torch.export.export(DenseConvs().eval(), _inputs(0))
    program = runtime.lower(exported)
    path = tmp_path_factory.mktemp("conv_in_tables") / "dense_convs.etvk"
    program.save(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lower_conv_in_table, "fold_input_tables", lambda rw: None)
        unfolded = runtime.lower(exported)
    return exported, program, path, unfolded


def _convs(program) -> dict[str, dict]:
    """The conv nodes' bound arguments by the name of their weight constant."""
    return {bind(n)["weights"].name: bind(n) for n in program.nodes if n.target == CONV}


def test_the_tables_a_pointwise_conv_alone_reads_go_into_it(lowered):
    _, program, _, unfolded = lowered
    before, after = (Counter(n.target for n in p.nodes) for p in (unfolded, program))
    assert (before[TABLES], after[TABLES]) == (5, 3)
    assert before[CONV] == after[CONV] == 5
    folded = {weights: b for weights, b in _convs(program).items() if b["input_table"] is not None}
    assert sorted(w.removesuffix("_w").rsplit("_", 1)[-1] for w in folded) == ["both", "fold"], list(folded)
    tables = {n.outputs[0]: bind(n) for n in unfolded.nodes if n.target == TABLES}
    for weights, b in folded.items():
        was = _convs(unfolded)[weights]
        original = tables[was["x"].name]
        # the conv reads what the table op read, through its table, with the same qparams
        assert b["x"] == original["x"] and isinstance(b["input_table"], Const)
        assert torch.equal(program.constants[b["input_table"].name], unfolded.constants[original["table"].name])
        assert (b["input_scale"], b["input_zero_point"]) == (was["input_scale"], was["input_zero_point"])
        assert program.values[b["x"].name].layout == "PACKED_INT8_CONV2D"
    # the conv after the grown cat also took the silu as its output table
    assert sum(b["lut"] is not None for b in folded.values()) == 1
    # the near misses: a 3x3 conv, a second reader, window sums
    left = [bind(n) for n in program.nodes if n.target == TABLES]
    assert sum(b["sums"] is not None for b in left) == 1
    readers = program.users()
    assert sorted(len(readers.get(n.outputs[0], [])) + (n.outputs[0] in program.outputs)
                  for n in program.nodes if n.target == TABLES) == [1, 1, 2]


def test_the_folded_program_runs_on_the_device_bit_exact(lowered):
    _, program, path, _ = lowered
    check_device_runs(path, program, _inputs)
    loaded = runtime.load(path)
    rows = {r["node"]: r for r in loaded.placement()}
    for node in program.nodes:
        if node.target == CONV and bind(node)["input_table"] is not None:
            assert rows[node.name]["op"] in ("etvk.q8ta_conv2d_pw.default", "etvk.q8ta_conv2d_pw_coop.default")


def test_the_fold_changes_no_value(lowered, tmp_path):
    exported, program, _, unfolded = lowered
    unfolded.save(tmp_path / "unfolded.etvk")
    loaded = runtime.load(tmp_path / "unfolded.etvk")
    for seed in (3, 4):
        inputs = _inputs(seed)
        for mine, theirs, device in zip(program.run_reference(*inputs), unfolded.run_reference(*inputs),
                                        loaded(*inputs), strict=True):
            assert torch.equal(mine, theirs) and torch.equal(device, theirs)


def test_no_fold_where_the_conv_also_reads_the_tables_as_its_residual():
    """A graph-level near miss: the table op's output read by one pointwise conv as its input
    and its residual stays (the residual would lose its producer)."""
    exported = torch.export.export(DenseConvs().eval(), _inputs(0))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lower_conv_in_table, "fold_input_tables", lambda rw: None)
        program = runtime.lower(exported)
    conv = next(n for n in program.nodes if n.target == CONV and bind(n)["weights"].name.endswith("fold_w"))
    b = bind(conv)
    residual = with_arguments(conv, residual=b["x"])
    program.nodes[program.nodes.index(conv)] = Node(conv.name, CONV, residual, {}, conv.outputs)
    lower_conv_in_table.fold_input_tables(Rewriter(program))
    after = bind(next(n for n in program.nodes if n.name == conv.name))
    assert after["input_table"] is None and after["x"] == after["residual"] == b["x"]
    assert b["x"].name in {n.outputs[0] for n in program.nodes if n.target == TABLES}
