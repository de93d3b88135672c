"""rms_norm_quantize, act_mul_quantize and add_rms_norm_quantize (docs/llm_ops.md, "Fused with
the per-token quantization") on the default Vulkan device, validation on.

Every case of `runtime.tools.examples_llm.QUANTIZE_CASES`, with host and with device inputs:
the fused op's outputs equal, bit for bit, the device's ops composed (binary's add for the
residual, rms_norm / act_mul, then quantize_affine_per_token_dynamic), and q, scales and zero
points equal what the reference quantize gives for the device's own float row; that row is
within its op's tolerance of the reference (docs/llm_ops.md). Bad arguments name the op and
the argument.
"""

from __future__ import annotations

import math

import pytest
import torch
from op_testlib import assert_argument_error

import runtime
from runtime.reference import llm as ref
from runtime.reference.quantize import quantize_affine_per_token_dynamic
from runtime.tools.examples_llm import BY_NAME, FUSED, QUANTIZE_CASES, inputs
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

QUANTIZE = "etvk.quantize_affine_per_token_dynamic.default"
NAMES = [c.name for c in QUANTIZE_CASES]


def op_of(short):
    return runtime.get_op(f"etvk.{short}.default")


def assert_bit_equal(got, want, what):
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} output {i}: {g.dtype} {g.shape}"
        if g.dtype == torch.float32:
            g, w = g.view(torch.int32), w.view(torch.int32)
        differ = int((g != w).sum())
        assert not differ, f"{what} output {i}: {differ} of {w.numel()} values differ"


def compose(case, args, stream=None):
    """The fused op's device ops one after the other (recorded in `stream`, else called):
    (the float row, its op's short name and arguments, and what the fused op must return)."""
    def call(short, *call_args):
        op = runtime.get_op(short if short == QUANTIZE else f"etvk.{short}.default")
        return op.record(stream, *call_args) if stream else op(*call_args)

    quant_eps = args[-1]
    short, float_args = FUSED[case.op], args[:-1]
    total = None
    if case.op == "add_rms_norm_quantize":
        total = call("binary", args[0], args[1], "add")
        float_args = (total, *args[2:-1])
    row = call(short, *float_args)
    quantized = call(QUANTIZE, row, quant_eps)
    return row, short, float_args, (() if total is None else (total,)) + tuple(quantized)


def assert_within_tolerance(short, got, want, args, what):
    """docs/llm_ops.md's tolerance of rms_norm / act_mul (act_mul's absolute term scales with |up|)."""
    rtol, atol = ref.tolerance(short, want.dtype)
    g, w = got.double(), want.double()
    scale = args[1].double().abs().clamp_min(1) if short == "act_mul" else 1
    over = (g - w).abs() > rtol * w.abs() + atol * scale
    assert not bool(over.any()), f"{what}: {int(over.sum())} values outside {short}'s tolerance"


@pytest.mark.parametrize("name", NAMES)
def test_fused_is_the_device_ops_composed_bit_for_bit(name, dispatch_trace):
    case = BY_NAME[name]
    args = inputs(case, torch.float32)
    fused = op_of(case.op)(*args)
    row, short, float_args, want = compose(case, args)
    assert_bit_equal(fused, want, f"{name}: against the ops composed")
    # the quantization: the reference's of the device's own row, bit for bit
    assert_bit_equal(fused[-3:], quantize_affine_per_token_dynamic(row, args[-1]),
                     f"{name}: against the reference quantize")
    # the float part: the device's row within its op's tolerance of the reference row (and the
    # residual sum PyTorch's own)
    assert_within_tolerance(short, row, getattr(ref, short)(*float_args), float_args, name)
    if case.op == "add_rms_norm_quantize":
        assert_bit_equal(fused[:1], (args[0] + args[1],), f"{name}: the sum")
    if row.numel():
        variant = op_of(case.op).variants[0].name
        assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("name", ["rms_norm_quantize_d4160_reread", "rms_norm_quantize_no_weight",
                                  "add_rms_norm_quantize_d4160_reread", "act_mul_quantize_silu_d16400_reread",
                                  "act_mul_quantize_gelu_erf"])
def test_device_inputs_in_one_stream(name):
    """Device-resident inputs, and the unfused ops recorded in the same stream (the row never
    leaves the device): the same bits."""
    case = BY_NAME[name]
    args = inputs(case, torch.float32)
    moved = [Tensor.from_torch(a) if isinstance(a, torch.Tensor) else a for a in args]
    with Stream() as stream:
        fused = op_of(case.op).record(stream, *moved)
        *_, composed = compose(case, moved, stream)
        stream.run()
        got = tuple(t.to_torch() for t in fused)
        want = tuple(t.to_torch() for t in composed)
    assert_bit_equal(got, want, f"{name} device inputs")
    assert_bit_equal(got, op_of(case.op)(*args), f"{name} host inputs")


def test_reference_is_the_composition():
    """torch.ops.etvk.* (the CPU kernels) compute the float ops, then torchao's quantization."""
    x, w, eps, offset, quant_eps = inputs(BY_NAME["rms_norm_quantize_gemma_offset"], torch.float32)
    want = quantize_affine_per_token_dynamic(ref.rms_norm(x, w, eps, offset), quant_eps)
    assert_bit_equal(torch.ops.etvk.rms_norm_quantize.default(x, w, eps, offset, quant_eps), want, "rms_norm")
    x, residual, w, eps, offset, quant_eps = inputs(BY_NAME["add_rms_norm_quantize_gemma_offset"], torch.float32)
    total = x + residual
    want = (total, *quantize_affine_per_token_dynamic(ref.rms_norm(total, w, eps, offset), quant_eps))
    assert_bit_equal(torch.ops.etvk.add_rms_norm_quantize.default(x, residual, w, eps, offset, quant_eps), want,
                     "add_rms_norm")
    gate, up, activation, quant_eps = inputs(BY_NAME["act_mul_quantize_gelu_tanh_gemma"], torch.float32)
    want = quantize_affine_per_token_dynamic(ref.act_mul(gate, up, activation), quant_eps)
    assert_bit_equal(torch.ops.etvk.act_mul_quantize.default(gate, up, activation, quant_eps), want, "act_mul")


def test_one_fp32_variant_each():
    for short in FUSED:
        assert [v.axes["DTYPE"] for v in op_of(short).variants] == ["float32"], short


# ---------------------------------------------------------------- bad arguments

NORM = inputs(BY_NAME["rms_norm_quantize_llama_prefill"], torch.float32)
ACT = inputs(BY_NAME["act_mul_quantize_silu_mlp"], torch.float32)
BAD_ARGS = [
    # op, argument index, bad value, argument name, text of the message
    ("rms_norm_quantize", 0, NORM[0].half(), "x", "must be float32 (the per-token quantization takes fp32 only)"),
    ("rms_norm_quantize", 0, torch.randn(1, 5, 6), "x", "positive multiple of 4"),
    ("rms_norm_quantize", 1, torch.randn(128), "weight", "of shape (256,)"),
    ("rms_norm_quantize", 2, -1.0, "eps", ">= 0"),
    ("rms_norm_quantize", 3, math.inf, "weight_offset", "finite"),
    ("rms_norm_quantize", 4, 0.0, "quant_eps", "must be a finite fp32 value >= 2**-64, got 0.0"),
    ("rms_norm_quantize", 4, 1e39, "quant_eps", "must be a finite fp32 value >= 2**-64"),
    ("add_rms_norm_quantize", 1, torch.randn(1, 5, 128), "residual", "x's shape (1, 5, 256) and dtype torch.float32"),
    ("add_rms_norm_quantize", 1, NORM[0].half(), "residual", "x's shape (1, 5, 256) and dtype torch.float32"),
    ("add_rms_norm_quantize", 5, -1.0, "quant_eps", "must be a finite fp32 value >= 2**-64"),
    ("act_mul_quantize", 0, ACT[0].half(), "gate", "must be float32"),
    ("act_mul_quantize", 0, torch.randn(1, 5, 342), "gate", "positive multiple of 4, got shape (1, 5, 342)"),
    ("act_mul_quantize", 1, torch.randn(1, 5, 340), "up", "gate's shape (1, 5, 344)"),
    ("act_mul_quantize", 2, "relu", "activation", "'silu', 'gelu_tanh' or 'gelu', got 'relu'"),
    ("act_mul_quantize", 3, math.nan, "quant_eps", "must be a finite fp32 value >= 2**-64"),
]


@pytest.mark.parametrize("row", BAD_ARGS, ids=[f"{r[0]}-{r[3]}-{r[4][:20]}" for r in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(row):
    short, index, value, arg, text = row
    args = list({"rms_norm_quantize": NORM, "act_mul_quantize": ACT,
                 "add_rms_norm_quantize": (NORM[0], NORM[0].clone(), *NORM[1:])}[short])
    args[index] = value
    assert_argument_error(op_of(short), args, arg, text)
