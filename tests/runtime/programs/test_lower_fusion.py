"""runtime/programs/lower_fusion.py on a small 8da4w block ([residual add,] RMSNorm, then a gated
MLP of 8da4w linears): an rms_norm or act_mul whose only reader is the per-token quantize of a
linear's input fuses with it, one whose output the program also returns stays apart, and a
residual add fuses with the RMSNorm after it even where the sum is read again. Either way the
loaded program runs on the device and agrees with its reference run (RMSNorm and the
activation within their stated tolerances: SQNR >= 80 dB, as in test_decoders.py).

Rope and cache writes: on a hand-made attention layer, rope(q), rope(k) and the two cache
writes become one rope_cache_update only where the graph provably allows it (one cos and sin,
one positions, rope(k) read by its cache write alone, the old caches read before); on decoders
(partial rotary in fp32, fp16 with q/k norms; several token counts), every layer's fuse, run
on the device, and give the unfused program's logits bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from program_cases import sqnr_db
from test_decoders import CACHE, COMMON, config_file, device_dispatches
from torch import nn

import runtime
from runtime.programs import lower_fusion
from runtime.programs.input_checks import derive_input_checks
from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.program import Program
from runtime.programs.rewrite import Rewriter
from runtime.tools import llm_models

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


# ------------------------------------------------------------- rope + cache writes

ROPE, UPDATE = "etvk.rope.default", "etvk.cache_update.default"
ROPE_UPDATE, ATTENTION = "etvk.rope_cache_update.default", "etvk.cache_attention.default"


def attention_layer(change: str = "") -> Program:
    """One attention layer as the decoder lowering leaves it: rope(q), rope(k), the k and v
    cache writes, cache_attention; `change` breaks one condition of the fusion."""
    b, s, hq, hkv, length, d = 1, 2, 4, 2, 8, 8
    spec = {"q": (b, s, hq, d), "k": (b, s, hkv, d), "v": (b, s, hkv, d), "cos": (b, s, d), "sin": (b, s, d),
            "cos2": (b, s, d), "k_cache": (b, hkv, length, d), "v_cache": (b, hkv, length, d),
            "rq": (b, s, hq, d), "rk": (b, s, hkv, d), "k_new": (b, hkv, length, d),
            "v_new": (b, hkv, length, d), "out": (b, s, hq, d), "seen": (b, hkv, length, d)}
    values = {name: ValueSpec(shape, torch.float32) for name, shape in spec.items()}
    values["pos"] = values["pos2"] = ValueSpec((s,), torch.int64)
    k_cos = Ref("cos2") if change == "other cos" else Ref("cos")
    v_pos = Ref("pos2") if change == "other positions" else Ref("pos")
    nodes = [Node("rope_q", ROPE, (Ref("q"), Ref("cos"), Ref("sin")), {}, ("rq",)),
             Node("rope_k", ROPE, (Ref("k"), k_cos, Ref("sin")), {}, ("rk",)),
             Node("write_k", UPDATE, (Ref("k_cache"), Ref("pos"), Ref("rk")), {}, ("k_new",)),
             Node("write_v", UPDATE, (Ref("v_cache"), v_pos, Ref("v")), {}, ("v_new",)),
             Node("attend", ATTENTION, (Ref("rq"), Ref("k_new"), Ref("v_new"), Ref("pos"), 0.5), {}, ("out",))]
    outputs = ["out"]
    if change == "rope(k) an output":
        outputs.append("rk")
    if change == "old cache read after":
        nodes.append(Node("read", "etvk.scalar.default", (Ref("k_cache"), 1.0, "mul"), {}, ("seen",)))
        outputs.append("seen")
    return Program(inputs=["q", "k", "v", "cos", "sin", "cos2", "pos", "pos2"], outputs=outputs, nodes=nodes,
                   values=values, constants={}, output_tuple=True, state={"k_cache": None, "v_cache": None},
                   state_updates={"k_cache": "k_new", "v_cache": "v_new"})


@pytest.mark.parametrize("change", ["", "other cos", "other positions", "rope(k) an output",
                                    "old cache read after"])
def test_rope_and_cache_writes_fuse_only_where_they_match(change):
    """The four nodes become one rope_cache_update (rope(q) kept as its first output, the caches'
    new versions as the others, rope(k) gone); with rope(k) rotated by other tables, the v cache
    written at other positions, rope(k) read elsewhere, or the old cache read after the first
    of them, nothing changes."""
    program = attention_layer(change)
    before = [n.target for n in program.nodes]
    lower_fusion.fuse_decoder_ops(Rewriter(program))
    if change:
        assert [n.target for n in program.nodes] == before
        return
    fused, attention = program.nodes
    assert (fused.target, attention.target) == (ROPE_UPDATE, ATTENTION)
    assert fused.args == (Ref("q"), Ref("k"), Ref("v"), Ref("cos"), Ref("sin"), Ref("k_cache"), Ref("v_cache"),
                          Ref("pos"))
    assert fused.outputs == ("rq", "k_new", "v_new") and "rk" not in program.values
    assert {(c.input, c.kind, c.bound) for c in derive_input_checks(program)} == {("pos", "position", 8)}


@pytest.mark.parametrize("family", ["phi3_partial_rotary", "qwen3 half"])
def test_rope_cache_update_changes_no_bit_of_a_decoder(family, tmp_path, monkeypatch):
    """A decoder (partial rotary; fp16 with q/k norms) lowered with and without the rope +
    cache-write fusion: one rope_cache_update a layer instead of two ropes and two cache
    writes, 3 dispatches fewer a layer, everything on the device, and logits bit-identical to
    the unfused program's at every step (a 4-token prompt in one call, then decoding)."""
    llm_models.import_transformers()
    name, _, half = family.partition(" ")
    model = llm_models.decoder(config_file(tmp_path, name))
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(model.half() if half else model), CACHE,
                                         dynamic=True)
    sizes = [1, 4]
    runtime.lower(exported, token_sizes=sizes).save(tmp_path / "fused.etvk")
    with monkeypatch.context() as patch:
        patch.setattr(lower_fusion, "_fuse_rope_cache_writes", lambda rewriter: None)
        runtime.lower(exported, token_sizes=sizes).save(tmp_path / "unfused.etvk")
    fused, unfused = runtime.load(tmp_path / "fused.etvk"), runtime.load(tmp_path / "unfused.etvk")
    layers = COMMON["num_hidden_layers"]
    for size in sizes:
        targets = [r["target"] for r in fused.placement(size)]
        assert targets.count(ROPE_UPDATE) == layers and not {ROPE, UPDATE} & set(targets)
        assert {r["runs_on"] for r in fused.placement(size)} == {"vulkan"}
    assert device_dispatches(unfused) - device_dispatches(fused) == 3 * layers
    bits = torch.int16 if half else torch.int32
    calls = [([5, 17, 3, 60], 0), ([11], 4), ([2], 5), ([40], 6)]
    for tokens, start in calls:
        inputs = dict(input_ids=torch.tensor([tokens]), cache_position=torch.arange(start, start + len(tokens)))
        got, want = fused(**inputs), unfused(**inputs)
        assert torch.equal(got.view(bits), want.view(bits)), start
