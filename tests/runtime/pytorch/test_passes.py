"""FuseQuantizedOps (`runtime.pytorch.passes.fuse_quantized_ops`) on torch.export programs.

`TORCHAO_CASES` quantize a Llama-style MLP the way users do (torchao's
``Int8DynActInt4WeightQuantizer``, ``quantize_`` with
``Int8DynamicActivationIntxWeightConfig``); `EXPLICIT_CASES` write one linear
with explicit dequantize ops (`QuantLinear`) to reach patterns torchao does not
emit. Each case states how many linears must fuse: a fused program must
compute what the original does within a tight tolerance (the fused op's CPU
kernel is the reference), and an untouched one must be unchanged. `FP16_CASES`
are fp16 linears (fp16 models quantized with ``precision=torch.float16``, and
dequantizes to fp16): they fuse into the op and a cast of its result to fp16,
within the fp16 roundings of the original's operands.
"""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
import torch.nn.functional as F
from torch import nn

import runtime  # noqa: F401  (registers torch.ops.etvk)
from runtime.families.int4 import unpack_int4
from runtime.pytorch.passes import fuse_quantized_ops

torchao = pytest.importorskip("torchao")
from torchao.quantization import (  # noqa: E402
    Int8DynActInt4WeightQuantizer,
    Int8DynamicActivationIntxWeightConfig,
    MappingType,
    quantize_,
)
from torchao.quantization.granularity import PerAxis, PerGroup  # noqa: E402

FUSED = torch.ops.etvk.linear_qta8a_qga4w.default
QD = torch.ops.quantized_decomposed
AO = torch.ops.torchao


class MLP(nn.Module):
    """Llama feed-forward: w2(silu(w1(x)) * w3(x))."""

    def __init__(self, dim=64, hidden=128, bias=False):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=bias)
        self.w3 = nn.Linear(dim, hidden, bias=bias)
        self.w2 = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def quantizer(group_size):
    return lambda m: Int8DynActInt4WeightQuantizer(groupsize=group_size).quantize(m)


def intx(**config):
    def apply(m):
        quantize_(m, Int8DynamicActivationIntxWeightConfig(**config))
        return m

    return apply


# id -> (quantize the MLP, bias, input shape, fused linears, run_decompositions({}) first)
TORCHAO_CASES = {
    "quantizer gs32": (quantizer(32), False, (4, 64), 3, False),
    "quantizer gs32 bias 3-D": (quantizer(32), True, (2, 3, 64), 3, False),
    "quantizer gs16 one token": (quantizer(16), False, (1, 64), 3, False),
    "quantizer gs64 decomposed({})": (quantizer(64), True, (2, 64), 3, True),
    "intx int4 gs32": (intx(weight_dtype=torch.int4, weight_granularity=PerGroup(32)), False, (5, 64), 3, False),
    "intx int4 asymmetric bias 3-D": (
        intx(weight_dtype=torch.int4, weight_granularity=PerGroup(32), weight_mapping_type=MappingType.ASYMMETRIC),
        True, (2, 3, 64), 3, False,
    ),
    "intx int4 per channel": (intx(weight_dtype=torch.int4, weight_granularity=PerAxis(0)), False, (3, 64), 3, False),
    "intx int3": (intx(weight_dtype=torch.int3, weight_granularity=PerGroup(32)), False, (3, 64), 3, False),
    "intx bf16 scales": (
        intx(weight_dtype=torch.int4, weight_granularity=PerGroup(32), weight_scale_dtype=torch.bfloat16),
        False, (3, 64), 3, False,
    ),
    "intx int4 decomposed({})": (intx(weight_dtype=torch.int4, weight_granularity=PerGroup(32)), True, (2, 64), 3, True),
    # what the op cannot take stays as it is
    "quantizer gs4": (quantizer(4), False, (4, 64), 0, False),
    "intx int4 gs4": (intx(weight_dtype=torch.int4, weight_granularity=PerGroup(4)), False, (4, 64), 0, False),
    "intx int8 weights": (intx(weight_dtype=torch.int8, weight_granularity=PerGroup(32)), False, (4, 64), 0, False),
}


class QuantLinear(nn.Module):
    """One linear written with explicit (de)quantize ops; each option bends one property.

    act: "decomposed" (quantized_decomposed per-token ops: fp64 scales, int64 zero
    points) or "affine" (torchao ops, int8 zero points); weight_op: "group"
    (dequantize_per_channel_group) or "affine" (dequantize_affine).
    """

    def __init__(self, n=32, k=64, group_size=32, *, act="affine", weight_op="affine", qrange=(-8, 7),
                 zero=0, zero_dtype=torch.int32, scale_dtype=torch.float32, fp64_scales=False, bias=False, flatten=False,
                 out_dtype=torch.float32, weight_input=False, zero_point_input=False, twice=False,
                 lifted=False):
        super().__init__()
        gen = torch.Generator().manual_seed(n * k + group_size)
        groups = k // group_size
        storage = torch.uint8 if qrange[0] >= 0 else torch.int8
        keep = (lambda name, t: setattr(self, name, t)) if lifted else self.register_buffer
        keep("w", torch.randint(qrange[0], qrange[1] + 1, (n, k), generator=gen).to(storage))
        scales = torch.rand(n, groups, generator=gen, dtype=torch.float64 if fp64_scales else torch.float32)
        keep("scales", (scales * 0.02 + 1e-3).to(scale_dtype))
        zeros = torch.randint(-8, 8, (n, groups), generator=gen) if zero == "random" else torch.full((n, groups), zero)
        keep("zeros", zeros.to(zero_dtype))
        self.bias = nn.Parameter(torch.randn(n, generator=gen).to(out_dtype)) if bias else None
        self.k, self.group_size, self.act, self.weight_op, self.qrange = k, group_size, act, weight_op, qrange
        self.dtype = torch.uint4 if storage == torch.uint8 else torch.int8
        self.flatten, self.out_dtype, self.twice = flatten, out_dtype, twice
        self.weight_input, self.zero_point_input = weight_input, zero_point_input

    def forward(self, x, extra=None):
        w = extra if self.weight_input else self.w
        if self.weight_op == "group":
            w_dq = QD.dequantize_per_channel_group(
                w, self.scales, self.zeros, *self.qrange, torch.int8, self.group_size, self.out_dtype
            )
        else:
            w_dq = AO.dequantize_affine(
                w, [1, self.group_size], self.scales, self.zeros, self.dtype, *self.qrange, self.out_dtype
            )
        y = F.linear(self._activation(x, extra), w_dq, self.bias)
        if self.twice:  # a second linear on the same dequantized weight
            y = y + F.linear(self._activation(2 * x, extra), w_dq)
        return y.reshape(*x.shape[:-1], -1) if self.flatten else y

    def _activation(self, x, extra):
        block = [1] * (x.dim() - 1) + [self.k]
        if self.act == "decomposed":
            scale, zp = QD.choose_qparams_per_token_asymmetric(x, torch.int8)
            q = QD.quantize_per_token(x, scale, zp, -128, 127, torch.int8)
            x_dq = QD.dequantize_per_token(q, scale, zp, -128, 127, torch.int8, self.out_dtype)
        else:
            scale, zp = AO.choose_qparams_affine(x, "ASYMMETRIC", block, torch.int8, -128, 127, None, None, torch.int8)
            if self.zero_point_input:
                zp = extra
            q = AO.quantize_affine(x, block, scale, zp, torch.int8, -128, 127)
            x_dq = AO.dequantize_affine(q, block, scale, zp, torch.int8, -128, 127, self.out_dtype)
        return x_dq.reshape(-1, self.k) if self.flatten else x_dq


# id -> (QuantLinear options, input shape, fused linears)
EXPLICIT_CASES = {
    "quantized_decomposed ops": ({"act": "decomposed", "weight_op": "group"}, (4, 64), 1),
    "quantized_decomposed 3-D bias": ({"act": "decomposed", "weight_op": "group", "bias": True}, (2, 3, 64), 1),
    "fp64 weight scales holding fp32 values": (
        {"act": "decomposed", "weight_op": "group", "scale_dtype": torch.float64}, (4, 64), 1,
    ),
    "affine activation, group weight": ({"weight_op": "group", "zero": "random"}, (3, 64), 1),
    "uint4 weights, zero point 8": ({"qrange": (0, 15), "zero": 8}, (3, 64), 1),
    "float zero points": ({"zero": "random", "zero_dtype": torch.float32}, (3, 64), 1),
    "reshape between dequantize and linear": ({"flatten": True, "bias": True}, (2, 3, 64), 1),
    "one weight, two linears": ({"twice": True}, (3, 64), 2),
    "weights are lifted tensor constants": ({"lifted": True, "zero": "random"}, (3, 64), 1),
    "group size 128 = K": ({"k": 128, "group_size": 128}, (3, 128), 1),
    # cannot be proven equivalent: stays as it is
    "weight zero point 9": ({"zero": 9}, (3, 64), 0),
    "uint4 weights, zero point 16": ({"qrange": (0, 15), "zero": 16}, (3, 64), 0),
    "fractional weight zero points": ({"zero": 0.5, "zero_dtype": torch.float32}, (3, 64), 0),
    "fp64 weight scales": ({"scale_dtype": torch.float64, "fp64_scales": True}, (3, 64), 0),
    "fp16 weight scales, quantized_decomposed": ({"weight_op": "group", "scale_dtype": torch.float16}, (3, 64), 0),
    "int8 weight range": ({"qrange": (-128, 127)}, (3, 64), 0),
    "group size 4": ({"group_size": 4}, (3, 64), 0),
    "group size 12": ({"k": 96, "group_size": 12}, (3, 96), 0),
    "weight is an input": ({"weight_input": True}, (3, 64), 0),
    "activation zero point is an input": ({"zero_point_input": True, "zero_dtype": torch.float32}, (3, 64), 0),
}


def _extra(options, shape):
    """The second forward argument a case needs (a weight or a zero point), else None."""
    if options.get("weight_input"):
        return torch.randint(-8, 8, (32, options.get("k", 64)), dtype=torch.int8)
    if options.get("zero_point_input"):
        return torch.zeros(shape[:-1], dtype=torch.float32)
    return None


def fused_nodes(program):
    return [n for n in program.graph.nodes if n.target is FUSED]


def graph_text(program):
    return [n.format_node() for n in program.graph.nodes]


def check(program, inputs, expected):
    """Fuses ``program`` and compares the result with the original."""
    before = graph_text(program)
    fused = fuse_quantized_ops(program)
    assert graph_text(program) == before, "the pass modified its input program"
    assert len(fused_nodes(fused)) == expected
    with torch.no_grad():
        want, got = program.module()(*inputs), fused.module()(*inputs)
    if expected == 0:
        assert graph_text(fused) == before
        assert torch.equal(got, want)
    else:
        assert not [n for n in fused.graph.nodes if n.target is torch.ops.aten.linear.default]
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
    return fused


@pytest.mark.parametrize("case", list(TORCHAO_CASES))
def test_torchao_mlp(case):
    quantize, bias, shape, expected, decompose = TORCHAO_CASES[case]
    torch.manual_seed(0)
    model = quantize(MLP(bias=bias)).eval()
    x = torch.randn(shape)
    program = torch.export.export(model, (x,))
    if decompose:
        program = program.run_decompositions({})
    fused = check(program, (x,), expected)
    adds = [n for n in fused.graph.nodes if n.target is torch.ops.aten.add.Tensor and n.args[0].target is FUSED]
    assert len(adds) == (expected if bias else 0)
    for node in fused_nodes(fused):
        x_q, group_size, scales = (node.args[i].meta["val"] if i != 4 else node.args[i] for i in (0, 4, 5))
        assert group_size * scales.shape[1] == x_q.shape[-1] and x_q.dtype == torch.int8


@pytest.mark.parametrize("case", list(EXPLICIT_CASES))
def test_explicit_dequantize_patterns(case):
    options, shape, expected = EXPLICIT_CASES[case]
    model = QuantLinear(**options)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 3
    extra = _extra(options, shape)
    inputs = (x,) if extra is None else (x, extra)
    check(torch.export.export(model, inputs), inputs, expected)


# id -> (QuantLinear options, input shape and dtype): linears of fp16 operands
FP16_CASES = {
    "fp32 input dequantized to fp16": ({"out_dtype": torch.float16}, (3, 64), torch.float32),
    "fp16 input, fp16 scales, bias": (
        {"out_dtype": torch.float16, "scale_dtype": torch.float16, "bias": True}, (3, 64), torch.float16),
    "fp16 input 3-D, fp16 zero points": (
        {"out_dtype": torch.float16, "zero": "random", "zero_dtype": torch.float16, "scale_dtype": torch.float16},
        (2, 3, 64), torch.float16),
}


@pytest.mark.parametrize("case", list(FP16_CASES))
def test_fp16_linears_fuse_with_one_cast(case):
    """An fp16 linear becomes the op (fp32), the add of its bias cast to fp32, and one cast of
    the sum to fp16. The original rounds each dequantized activation and weight to fp16
    (2**-11 relative) and its result once; the fused op's operands are exact. So per output
    ``|got - want| <= 2**-10 * S + 2**-10 * |want|`` (S the sum of |x_dq * w_dq| and |bias|,
    from the exact dequantized values), and the fused result is the exact one rounded once to
    fp16, within the op's fp32 error (``2**-20 * S`` is far above it)."""
    options, shape, dtype = FP16_CASES[case]
    model = QuantLinear(**options)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    program = torch.export.export(model, (x,))
    fused = fuse_quantized_ops(program)
    assert len(fused_nodes(fused)) == 1
    assert not [n for n in fused.graph.nodes if n.target is torch.ops.aten.linear.default]
    casts = [n for n in fused.graph.nodes if n.target is torch.ops.aten._to_copy.default]
    to_half = [n for n in casts if n.kwargs["dtype"] == torch.float16]
    assert len(to_half) == 1 and to_half[0].args[0].meta["val"].dtype == torch.float32
    with torch.no_grad():
        want, got = program.module()(x), fused.module()(x)
    assert got.dtype == want.dtype == torch.float16
    block = [1] * (x.dim() - 1) + [model.k]
    scale, zp = AO.choose_qparams_affine(x, "ASYMMETRIC", block, torch.int8, -128, 127, None, None, torch.int8)
    q = AO.quantize_affine(x, block, scale, zp, torch.int8, -128, 127)
    x_dq = (q.double() - zp.double().unsqueeze(-1)) * scale.double().unsqueeze(-1)
    per_group = [t.double().repeat_interleave(model.group_size, dim=1) for t in (model.zeros, model.scales)]
    w_dq = (model.w.double() - per_group[0]) * per_group[1]
    bias = 0 if model.bias is None else model.bias.detach().double()
    exact = x_dq @ w_dq.T + bias
    magnitude = x_dq.abs() @ w_dq.abs().T + (bias.abs() if model.bias is not None else 0)
    error = (got.double() - want.double()).abs()
    assert bool((error <= 2.0**-10 * magnitude + 2.0**-10 * want.double().abs()).all()), float(error.max())
    # the fused result: the exact value rounded once to fp16, but for the op's fp32 error
    assert bool(((got.double() - exact).abs() <= 2.0**-11 * exact.abs() + 2.0**-20 * magnitude).all())


# id -> (model, its weight constants, shift c from the declared range onto [-8, 7])
PACKED_CASES = {
    "quantizer MLP": (lambda: quantizer(32)(MLP()), ["w1.weight", "w3.weight", "w2.weight"], 0),
    "uint4 weights, zero point 8": (lambda: QuantLinear(qrange=(0, 15), zero=8), ["w"], 8),
}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_new_buffers_hold_the_weights_and_old_ones_are_dropped(case):
    make, weights, shift = PACKED_CASES[case]
    torch.manual_seed(0)
    program = torch.export.export(make(), (torch.randn(2, 64),))
    before = dict(program.state_dict)
    fused = fuse_quantized_ops(program)
    assert program.state_dict.keys() == before.keys()
    for key in weights:
        weight, packed = before[key], fused.state_dict[f"{key}_etvk_packed"]
        assert packed.dtype == torch.uint8 and packed.shape == (weight.shape[0], weight.shape[1] // 2)
        assert torch.equal(unpack_int4(packed), (weight.int() - shift).to(torch.int8))
        zeros, scales = fused.state_dict[f"{key}_etvk_zeros"], fused.state_dict[f"{key}_etvk_scales"]
        assert zeros.dtype == torch.int32 and not zeros.any()
        assert scales.dtype == torch.float32 and scales.shape == zeros.shape == (weight.shape[0], weight.shape[1] // 32)
    dropped = sorted(k for k in before if k not in fused.state_dict)
    assert dropped == sorted(k for k in before if not k.endswith("bias"))


def test_one_weight_two_linears_share_one_packed_buffer():
    model = QuantLinear(twice=True)
    x = torch.randn(3, 64)
    fused = fuse_quantized_ops(torch.export.export(model, (x,)))
    assert len(fused_nodes(fused)) == 2
    assert sorted(k for k in fused.state_dict if "etvk" in k) == ["w_etvk_packed", "w_etvk_scales", "w_etvk_zeros"]


def test_fusing_twice_changes_nothing_and_the_result_exports_again():
    torch.manual_seed(0)
    model = quantizer(32)(MLP())
    x = torch.randn(2, 3, 64)
    fused = fuse_quantized_ops(torch.export.export(model, (x,)))
    again = fuse_quantized_ops(fused)
    assert graph_text(again) == graph_text(fused)
    reexported = torch.export.export(fused.module(), (x,))
    assert len(fused_nodes(reexported)) == 3
    assert torch.equal(reexported.module()(x), fused.module()(x))


@pytest.mark.parametrize(
    ("case", "make"),
    [
        ("quantizer MLP", lambda: quantizer(32)(MLP(bias=True))),
        ("quantized_decomposed with reshape", lambda: QuantLinear(act="decomposed", weight_op="group", flatten=True)),
    ],
)
def test_dynamic_batch(case, make):
    torch.manual_seed(0)
    model = make()
    batch = torch.export.Dim("batch", min=2, max=64)
    program = torch.export.export(model, (torch.randn(4, 3, 64),), dynamic_shapes=({0: batch},))
    fused = fuse_quantized_ops(program)
    assert len(fused_nodes(fused)) == len([n for n in program.graph.nodes if n.target is torch.ops.aten.linear.default])
    x = torch.randn(7, 3, 64)
    with torch.no_grad():
        want, got = program.module()(x), fused.module()(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))
