"""runtime/programs/lower_fusion.py on a small 8da4w block (RMSNorm, then a gated MLP of 8da4w
linears): an rms_norm or act_mul whose only reader is the per-token quantize of a linear's
input fuses with it; one whose output the program also returns stays apart. Either way the
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
QUANTIZE = "etvk.quantize_affine_per_token_dynamic.default"
OPS = ("etvk.rms_norm_quantize.default", "etvk.act_mul_quantize.default", "etvk.rms_norm.default",
       "etvk.act_mul.default", QUANTIZE)


class Block(nn.Module):
    """Llama's RMSNorm, then w2(silu(w1 h) * w3 h); `returns` names the extra outputs: the norm's
    ("norm") and the activation product's ("product")."""

    def __init__(self, returns=()):
        super().__init__()
        self.returns = returns
        self.weight = nn.Parameter(torch.randn(DIM))
        self.w1, self.w3 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        h = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        product = F.silu(self.w1(h)) * self.w3(h)
        extra = {"norm": h, "product": product}
        return (self.w2(product), *(extra[name] for name in self.returns))


# extra outputs -> how many of OPS the lowered program holds
CASES = {
    "both fused": ((), [1, 1, 0, 0, 0]),
    "the norm is also an output": (("norm",), [0, 1, 1, 0, 1]),
    "the product is also an output": (("product",), [1, 0, 0, 1, 1]),
}


@pytest.mark.parametrize("case", CASES)
def test_fuses_only_where_the_quantize_is_the_only_reader(case, tmp_path):
    pytest.importorskip("torchao", reason="8da4w quantization needs torchao")
    from torchao.quantization import Int8DynActInt4WeightQuantizer

    returns, counts = CASES[case]
    torch.manual_seed(0)
    model = Int8DynActInt4WeightQuantizer(groupsize=32).quantize(Block(returns)).eval()
    x = torch.randn(1, 3, DIM)
    program = runtime.lower(torch.export.export(model, (x,)))
    targets = [n.target for n in program.nodes]
    assert [targets.count(t) for t in OPS] == counts, targets
    program.save(tmp_path / "block.etvk")
    loaded = runtime.load(tmp_path / "block.etvk")
    assert {r["runs_on"] for r in loaded.placement() if r["target"] in OPS} == {"vulkan"}
    for got, want in zip(loaded(x), program.run_reference(x), strict=True):
        assert sqnr_db(got, want) >= 80, case
