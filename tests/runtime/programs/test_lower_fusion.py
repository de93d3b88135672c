"""runtime/programs/lower_fusion.py on a small 8da4w block ([residual add,] RMSNorm, then a gated
MLP of 8da4w linears): an rms_norm or act_mul whose only reader is the per-token quantize of a
linear's input fuses with it, one whose output the program also returns stays apart, and a
residual add fuses with the RMSNorm after it even where the sum is read again. Either way the
loaded program runs on the device and agrees with its reference run (RMSNorm and the
activation within their stated tolerances: SQNR >= 80 dB, as in test_decoders.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from program_cases import sqnr_db
from torch import nn

import runtime

DIM, HIDDEN = 64, 128
OPS = ("etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default", "etvk.act_mul_quantize.default",
       "etvk.rms_norm.default", "etvk.act_mul.default", "etvk.binary.default",
       "etvk.quantize_affine_per_token_dynamic.default")


class Block(nn.Module):
    """[x + residual,] Llama's RMSNorm, then w2(silu(w1 h) * w3 h); `returns` names the extra
    outputs: the sum's ("sum"), the norm's ("norm") and the activation product's ("product")."""

    def __init__(self, returns=()):
        super().__init__()
        self.returns = returns
        self.weight = nn.Parameter(torch.randn(DIM))
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x, residual=None):
        total = x if residual is None else x + residual
        h = self.weight * (total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6))
        product = F.silu(self.w1(h)) * self.w3(h)
        extra = {"sum": total, "norm": h, "product": product}
        return (self.w2(product), *(extra[name] for name in self.returns))


# case -> (a residual input, extra outputs, how many of OPS the lowered program holds)
CASES = {
    "both fused": (False, (), [1, 0, 1, 0, 0, 0, 0]),
    "the norm is also an output": (False, ("norm",), [0, 0, 1, 1, 0, 0, 1]),
    "the product is also an output": (False, ("product",), [1, 0, 0, 0, 1, 0, 1]),
    "residual add, its sum also an output": (True, ("sum",), [0, 1, 1, 0, 0, 0, 0]),
    "residual add, the norm also an output": (True, ("norm",), [0, 0, 1, 1, 0, 1, 1]),
}


@pytest.mark.parametrize("case", CASES)
def test_fuses_only_where_the_fused_op_writes_every_value_read(case, tmp_path):
    pytest.importorskip("torchao", reason="8da4w quantization needs torchao")
    from torchao.quantization import Int8DynActInt4WeightQuantizer

    residual, returns, counts = CASES[case]
    torch.manual_seed(0)
    model = Int8DynActInt4WeightQuantizer(groupsize=32).quantize(Block(returns)).eval()
    inputs = (torch.randn(1, 3, DIM), torch.randn(1, 3, DIM))[:2 if residual else 1]
    program = runtime.lower(torch.export.export(model, inputs))
    targets = [n.target for n in program.nodes]
    assert [targets.count(t) for t in OPS] == counts, targets
    program.save(tmp_path / "block.etvk")
    loaded = runtime.load(tmp_path / "block.etvk")
    assert {r["runs_on"] for r in loaded.placement() if r["target"] in OPS} == {"vulkan"}
    for got, want in zip(loaded(*inputs), program.run_reference(*inputs), strict=True):
        assert sqnr_db(got, want) >= 80, case
