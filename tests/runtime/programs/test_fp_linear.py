"""Linears a quantizer left in floating point: ``aten.linear`` with constant fp32 weights becomes
``etvk.linear`` (docs/llm_ops.md), beside an 8da4w-quantized linear that stays
``etvk.linear_qta8a_qga4w``.

A small module (two fp32 linears, the first with a bias, with a SiLU between, and one 8da4w
linear of the same input) is exported for 1 and for 3 tokens, lowered, saved and loaded; the
loaded program's outputs are compared with `program.run_reference` and with the module's own
(PyTorch's) outputs within bounds derived from docs/llm_ops.md.
"""

from __future__ import annotations

import pytest
import torch
from program_cases import sqnr_db

import runtime
from runtime.tools import examples, llm_models

K, HIDDEN, N, SIDE = 64, 96, 40, 32
U = 2.0**-24


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(11)
        self.fc1 = torch.nn.Linear(K, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, N, bias=False)
        self.side = torch.nn.Sequential(torch.nn.Linear(K, SIDE, bias=False))
        for p in self.parameters():
            p.data = torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5

    def forward(self, x):
        return self.fc2(torch.nn.functional.silu(self.fc1(x))), self.side(x)


def fp_bound(x, block):
    """How far two fp32 evaluations of ``fc2(silu(fc1(x)))`` may be apart when each linear sums
    in any order (γ_{K+2}·S of each, S the magnitude sum of docs/llm_ops.md, doubled: both
    sides err) and SiLU is the same function of its input (its slope is below 1.1)."""
    w1, b1, w2 = (t.double() for t in (block.fc1.weight, block.fc1.bias, block.fc2.weight))
    x = x.double()
    s1 = x.abs() @ w1.abs().T + b1.abs()
    e1 = 2 * (K + 2) * U / (1 - (K + 2) * U) * s1
    h = torch.nn.functional.silu(x @ w1.T + b1)
    s2 = h.abs() @ w2.abs().T
    return 2 * (HIDDEN + 2) * U / (1 - (HIDDEN + 2) * U) * s2 + (1.1 * e1) @ w2.abs().T


@pytest.mark.parametrize("tokens", [1, 3])
def test_fp_linears_run_on_the_device(tokens, tmp_path):
    block = Block().eval()
    block.side = llm_models.quantize_8da4w(block.side)
    x = torch.randn(1, tokens, K, generator=torch.Generator().manual_seed(tokens))
    exported = torch.export.export(block, (x,))
    program = runtime.lower(exported)
    targets = [n.target for n in program.nodes]
    assert "aten.linear.default" not in targets, targets
    assert targets.count("etvk.linear.default") == 2 and "etvk.linear_qta8a_qga4w.default" in targets
    program.save(tmp_path / "block.etvk")
    loaded = runtime.load(tmp_path / "block.etvk")
    placed = {r["target"]: r["runs_on"] for r in loaded.placement()}
    assert placed["etvk.linear.default"] == "vulkan"

    got, got_side = loaded(x)
    reference, reference_side = program.run_reference(x)
    with torch.no_grad():
        module, module_side = block(x)
    bound = fp_bound(x, block)
    for name, want in (("run_reference", reference), ("module", module)):
        over = (got.double() - want.double()).abs() > bound
        assert not bool(over.any()), f"{name}: {int(over.sum())} outputs outside the bound"
    # the 8da4w linear: within its op's tolerance of the reference run (runtime/tools/examples.py)
    quantized = next(n for n in program.nodes if n.target == "etvk.linear_qta8a_qga4w.default")
    tolerance = examples.tolerance(quantized.target, reference_side, ())
    assert float((got_side - reference_side).abs().max()) <= tolerance
    assert sqnr_db(got_side, module_side) >= 30  # as the decoders' logits (test_decoders.py)
