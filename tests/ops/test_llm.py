"""llm family (embedding, rms_norm, rope, act_mul, binary, scalar, linear) on the default
Vulkan device, validation on.

Every case of `runtime.tools.examples_llm` runs on every variant of its op (one per
activation dtype), with host and with device inputs: embedding, rope, binary and scalar
must equal the reference bit for bit, rms_norm, act_mul and linear stay within the
tolerances of docs/llm_ops.md. The references must equal PyTorch's eager expressions (Hugging Face's
formulas) bit for bit where the page says so, and rope and binary shaders must equal
PyTorch's fp32 eager results bit for bit. Embedding indices are range-checked on the host
before any upload; bad arguments name the op and argument.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from op_testlib import assert_argument_error

import runtime
from runtime.families.llm import broadcast
from runtime.reference import llm as ref
from runtime.tools.examples_llm import BY_NAME, CASES, inputs
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

DTYPES = {"float32": torch.float32, "float16": torch.float16}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16}


def op_of(short):
    return runtime.get_op(f"etvk.{short}.default")


def assert_matches(short, got, want, args, what):
    """Bit-exact for the exact ops; within docs/llm_ops.md's tolerance for the others."""
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype} {got.shape}"
    rtol, atol = ref.tolerance(short, want.dtype)
    if short != "linear" and rtol == 0 and atol == 0:
        differ = int((got.view(BITS[got.dtype]) != want.view(BITS[want.dtype])).sum())
        assert not differ, f"{what}: {differ} of {want.numel()} values differ in their bits"
        return
    g, w = got.double(), want.double()
    if short == "linear":
        bound = ref.linear_bound(*args)
    else:
        bound = rtol * w.abs() + atol * (args[1].double().abs().clamp_min(1) if short == "act_mul" else 1)
    over = (g - w).abs() > bound
    assert not bool(torch.isnan(g).any()), f"{what}: NaN"
    assert not bool(over.any()), (
        f"{what}: {int(over.sum())} values outside the tolerance, e.g. got {g[over][:3].tolist()} "
        f"want {w[over][:3].tolist()}")


def _variant_cases():
    return [pytest.param(case, info.name, id=f"{info.name}-{case.name}")
            for case in CASES for info in op_of(case.op).variants]


@pytest.mark.parametrize(("case", "variant"), _variant_cases())
def test_case_matches_reference(case, variant, dispatch_trace):
    op = op_of(case.op)
    dtype = DTYPES[next(v.axes for v in op.variants if v.name == variant)["DTYPE"]]
    args = inputs(case, dtype)
    want = op.reference(*args)
    got = op(*args, variant=variant)
    assert_matches(case.op, got, want, args, f"{variant} {case.name}")
    if want.numel():
        assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("name", ["embedding_d6_rows_straddle_units", "rms_norm_gemma_offset",
                                  "rope_d12_halves_straddle_units", "rope_partial_d10_r6_units_straddle_the_tail",
                                  "act_mul_silu_odd_numel",
                                  "binary_mixed_broadcast_sub", "scalar_add_third",
                                  "linear_k70_n13_rows_straddle_units"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float", "half"])
def test_device_tensor_inputs(name, dtype):
    """Tensor arguments already on the device (an earlier op's outputs) give the same results."""
    case = BY_NAME[name]
    args = inputs(case, dtype)
    op = op_of(case.op)
    moved = [Tensor.from_torch(a) if isinstance(a, torch.Tensor) else a for a in args]
    with Stream() as stream:
        out = op.record(stream, *moved)
        stream.run()
        got = out.to_torch()
    assert_matches(case.op, got, op.reference(*args), args, f"{name} device inputs")


def test_every_variant_has_cases():
    """Each llm op has cases in the table, and each of its variants is one DTYPE."""
    for short in ("embedding", "rms_norm", "layer_norm", "rope", "act_mul", "binary", "scalar", "linear"):
        assert any(c.op == short for c in CASES), short
        assert sorted(v.axes["DTYPE"] for v in op_of(short).variants) == ["float16", "float32"]


# ---------------------------------------------------------------- against PyTorch's own code


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embedding_is_f_embedding(dtype, index_dtype):
    weight = torch.randn(40, 12).to(dtype)
    weight[3, 0] = math.nan
    weight[5, 1] = -0.0
    indices = torch.tensor([[3, 5, 0], [39, 3, 7]], dtype=index_dtype)
    want = F.embedding(indices.long(), weight)
    bits = BITS[dtype]
    assert torch.equal(ref.embedding(weight, indices).view(bits), want.view(bits))
    assert torch.equal(op_of("embedding")(weight, indices).view(bits), want.view(bits))


def llama_rms_norm(x, weight, eps):
    """Hugging Face's LlamaRMSNorm.forward."""
    input_dtype = x.dtype
    hidden_states = x.to(torch.float32)
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + eps)
    return weight * hidden_states.to(input_dtype)


def gemma_rms_norm(x, weight, eps):
    """Hugging Face's GemmaRMSNorm.forward."""
    output = x.float()
    output = output * torch.rsqrt(output.pow(2).mean(-1, keepdim=True) + eps)
    output = output * (1.0 + weight.float())
    return output.type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_reference_is_hugging_faces(dtype):
    """Llama's form bit for bit; Gemma's (1 + w) form bit for bit in fp32, and in fp16
    within the tolerance (Gemma rounds y to fp16 only after the product)."""
    gen = torch.Generator().manual_seed(4)
    x = (torch.randn(6, 96, generator=gen) * 3).to(dtype)
    w = torch.randn(96, generator=gen).to(dtype)
    bits = BITS[dtype]
    assert torch.equal(ref.rms_norm(x, w, 1e-6).view(bits), llama_rms_norm(x, w, 1e-6).view(bits))
    gemma = gemma_rms_norm(x, w, 1e-6)
    if dtype == torch.float32:
        assert torch.equal(ref.rms_norm(x, w, 1e-6, 1.0).view(bits), gemma.view(bits))
    else:
        assert_matches("rms_norm", ref.rms_norm(x, w, 1e-6, 1.0), gemma, (x, w), "Gemma fp16")


def hf_apply_rotary_pos_emb(q, cos, sin):
    """Hugging Face's apply_rotary_pos_emb on [B, H, S, D] q with cos, sin [B, S, D]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return (q * cos) + (rotated * sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rope_is_hugging_faces_bit_for_bit(dtype):
    """The reference and the shader equal Hugging Face's eager formula (heads transposed),
    in fp32 and fp16: each product rounded, then the sum, no fma."""
    gen = torch.Generator().manual_seed(5)
    B, S, H, D = 2, 7, 3, 64
    x = (torch.randn(B, S, H, D, generator=gen) * 4).to(dtype)
    positions = torch.arange(S, dtype=torch.float32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1).expand(B, S, D)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    want = hf_apply_rotary_pos_emb(x.transpose(1, 2), cos, sin).transpose(1, 2)
    bits = BITS[dtype]
    assert torch.equal(ref.rope(x, cos, sin).view(bits), want.view(bits))
    assert torch.equal(op_of("rope")(x, cos, sin).view(bits), want.view(bits))


def hf_partial_apply_rotary_pos_emb(q, cos, sin):
    """Hugging Face's apply_rotary_pos_emb of Phi-3 (StableLM's, GPT-NeoX's alike) on [B, H, S, D]
    q with cos, sin [B, S, R]: the first R values of each head rotated, the rest passed through."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rotary_dim = cos.shape[-1]
    q_rot, q_pass = q[..., :rotary_dim], q[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat((-q_rot[..., half:], q_rot[..., :half]), dim=-1)
    return torch.cat([(q_rot * cos) + (rotated * sin), q_pass], dim=-1)


# Bits a conversion through fp32 could change, for the passed-through tail: a NaN with a
# payload, -0, a subnormal, -infinity.
TAIL_BITS = {torch.float32: [0x7FC01234, 0x80000000, 0x00000ABC, 0xFF800000],
             torch.float16: [0x7E12, 0x8000, 0x0003, 0xFC00]}


@pytest.mark.parametrize("rotary", [16, 20, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_partial_rope_is_hugging_faces_bit_for_bit(dtype, rotary):
    """Partial rotary (R = cos.shape[-1] < D: Phi-3 with partial_rotary_factor, StableLM): the
    reference and the shader equal Hugging Face's formula bit for bit, whole units (R % 8 == 0)
    or value by value (R = 20), and the tail keeps every bit (NaN payloads, -0, subnormals)."""
    gen = torch.Generator().manual_seed(7)
    B, S, H, D = 2, 5, 3, 64
    x = (torch.randn(B, S, H, D, generator=gen) * 4).to(dtype)
    bits = BITS[dtype]
    if rotary < D:
        x.view(bits)[..., rotary:rotary + 4] = torch.tensor(TAIL_BITS[dtype]).to(bits)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary))
    freqs = torch.outer(torch.arange(S, dtype=torch.float32) + 3, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1).expand(B, S, rotary)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    want = hf_partial_apply_rotary_pos_emb(x.transpose(1, 2), cos, sin).transpose(1, 2)
    assert torch.equal(ref.rope(x, cos, sin).view(bits), want.view(bits))
    assert torch.equal(op_of("rope")(x, cos, sin).view(bits), want.view(bits))


TORCH_ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda g: F.gelu(g, approximate="tanh"),
                     "gelu": F.gelu}


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_act_mul_reference_is_pytorchs_activation(activation, dtype):
    """PyTorch's own activations in float64, then ``* up`` in the dtype, are within the
    tolerance of the reference on [-3, 10] (below, PyTorch's GELU forms lose the tail to
    cancellation even in float64; docs/llm_ops.md). PyTorch's fp32 eager silu and
    gelu_tanh are too; its fp32 GELU (erf) is up to 2e-4 off there, so it is not."""
    gate = torch.linspace(-3, 10, 5001).to(dtype)
    up = torch.randn(5001, generator=torch.Generator().manual_seed(6)).to(dtype)
    torch_act = TORCH_ACTIVATIONS[activation]
    want = ref.act_mul(gate, up, activation)
    in_float64 = torch_act(gate.double()).float().to(dtype) * up
    assert_matches("act_mul", in_float64, want, (gate, up), f"PyTorch float64 {activation}")
    if activation != "gelu":
        assert_matches("act_mul", torch_act(gate) * up, want, (gate, up), f"PyTorch {activation}")


def test_gelu_tail_keeps_fp32_accuracy():
    """Where PyTorch's GELU formula cancels (1 + erf(z) for z << 0), the reference and the
    shader keep fp32's relative accuracy: x * Phi(x) at -5 is -1.4333e-6."""
    gate, up = torch.tensor([-5.0, -8.0]), torch.ones(2)
    exact = torch.tensor([x * 0.5 * math.erfc(-x / math.sqrt(2)) for x in (-5.0, -8.0)],
                         dtype=torch.float64)
    for name, got in (("reference", ref.act_mul(gate, up, "gelu")),
                      ("shader", op_of("act_mul")(gate, up, "gelu"))):
        relative = ((got.double() - exact).abs() / exact.abs()).max().item()
        assert relative < 2.0**-16, f"{name}: {relative}"


@pytest.mark.parametrize("operation", ["add", "sub", "mul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_binary_is_pytorchs_bit_for_bit(operation, dtype):
    """Every broadcast case, shader and reference against PyTorch's own a <op> b."""
    torch_op = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[operation]
    bits = BITS[dtype]
    for case in (c for c in CASES if c.op == "binary"):
        a, b, _ = inputs(case, dtype)
        want = torch_op(a, b)
        assert torch.equal(ref.binary(a, b, operation).view(bits), want.view(bits)), case.name
        assert torch.equal(op_of("binary")(a, b, operation).view(bits), want.view(bits)), case.name


@pytest.mark.parametrize("operation", ["add", "mul"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scalar_is_pytorchs_bit_for_bit(operation, dtype):
    """PyTorch rounds the Python scalar to fp32 for mul but to the tensor's dtype for add;
    both the reference and the shader follow, for values that tell the two apart."""
    a = (torch.randn(4000, generator=torch.Generator().manual_seed(7)) * 3).to(dtype)
    bits = BITS[dtype]
    for value in (0.1, 1 / 3, 2.7182818, 33.3333333, 1 + 2.0**-11 + 2.0**-40, -1e-3):
        want = a + value if operation == "add" else a * value
        assert torch.equal(ref.scalar(a, value, operation).view(bits), want.view(bits)), value
        assert torch.equal(op_of("scalar")(a, value, operation).view(bits), want.view(bits)), value


# ---------------------------------------------------------------- host rules


BROADCASTS = [
    # a shape, b shape, merged sizes (innermost first), b strides
    ((2, 3, 4), (2, 3, 4), (24, 1, 1, 1), (1, 0, 0, 0)),
    ((2, 3, 4), (), (24, 1, 1, 1), (0, 0, 0, 0)),
    ((2, 3, 4), (4,), (4, 6, 1, 1), (1, 0, 0, 0)),
    ((2, 3, 4), (3, 1), (4, 3, 2, 1), (0, 1, 0, 0)),
    ((5, 1, 4), (1, 1, 4), (4, 5, 1, 1), (1, 0, 0, 0)),
    ((2, 3, 4, 5), (2, 1, 4, 1), (5, 4, 3, 2), (0, 1, 0, 4)),
    ((4, 3, 6), (1, 3, 6), (18, 4, 1, 1), (1, 0, 0, 0)),
]


@pytest.mark.parametrize(("a_shape", "b_shape", "sizes", "strides"), BROADCASTS)
def test_broadcast_merges_dimensions(a_shape, b_shape, sizes, strides):
    plan = broadcast(a_shape, b_shape)
    assert (plan.sizes, plan.strides) == (sizes, strides)
    a = torch.arange(math.prod(a_shape)).reshape(a_shape)
    b = torch.arange(math.prod(b_shape)).reshape(b_shape)
    # b's element of each value of a, by the merged dimensions: what the shader computes
    i = torch.arange(a.numel())
    index = torch.zeros_like(i)
    for size, stride in zip(plan.sizes, plan.strides, strict=True):
        index += (i % size) * stride
        i = i // size
    assert torch.equal(b.reshape(-1)[index], torch.broadcast_to(b, a_shape).reshape(-1))


def test_broadcast_refuses_what_does_not_broadcast_to_a():
    assert broadcast((2, 3), (3, 3)) is None
    assert broadcast((3,), (2, 3)) is None  # the output would not keep a's shape
    assert broadcast((3, 2, 3, 2, 3), (3, 1, 3, 1, 3)).dims == 5


def test_embedding_checks_indices_before_uploading(dispatch_trace_path):
    weight = torch.randn(10, 8)
    op = op_of("embedding")
    before = dispatch_trace_path.read_text() if dispatch_trace_path.exists() else ""
    for bad in (10, -1, 2**40):
        indices = torch.tensor([[1, 2], [bad, 3]], dtype=torch.int64)
        with pytest.raises(ValueError, match=rf"^etvk.embedding.default: argument 'indices': holds {bad}, outside \[0, 10\)"):
            op(weight, indices)
    after = dispatch_trace_path.read_text() if dispatch_trace_path.exists() else ""
    assert after == before, "a refused call reached the device"


def test_device_indices_outside_the_table_read_nothing():
    """Device indices cannot be checked on the host: a bad id gives a row of zeros."""
    weight = torch.randn(10, 8) + 5
    indices = Tensor.from_torch(torch.tensor([1, 10, -3, 9], dtype=torch.int32))
    got = op_of("embedding")(weight, indices)
    assert torch.equal(got[0], weight[1]) and torch.equal(got[3], weight[9])
    assert torch.equal(got[1:3], torch.zeros(2, 8))


def test_torch_ops_run_the_references():
    a, b, _ = inputs(BY_NAME["binary_norm_weight_mul"], torch.float32)
    assert torch.equal(torch.ops.etvk.binary.default(a, b, "mul"), a * b)
    x, w, eps, _ = inputs(BY_NAME["rms_norm_llama_prefill"], torch.float16)
    assert torch.equal(torch.ops.etvk.rms_norm.default(x, w, eps), llama_rms_norm(x, w, eps))


# ---------------------------------------------------------------- bad arguments


def _args(case_name, changes, dtype=torch.float32):
    case = BY_NAME[case_name]
    args = list(inputs(case, dtype))
    names = {"embedding": ["weight", "indices"], "rms_norm": ["x", "weight", "eps", "weight_offset"],
             "rope": ["x", "cos", "sin"], "act_mul": ["gate", "up", "activation"],
             "binary": ["a", "b", "operation"], "scalar": ["a", "value", "operation"],
             "linear": ["x", "weight", "bias"]}[case.op]
    for name, value in changes.items():
        args[names.index(name)] = value
    return case.op, args


BAD_ARGS = [
    ("embedding_prefill_d64", "weight", torch.randn(100), "[V, D] table"),
    ("embedding_prefill_d64", "weight", torch.zeros(100, 64, dtype=torch.int32), "dtype torch.int32 is not supported"),
    ("embedding_prefill_d64", "indices", torch.zeros(1, 7), "int32 or int64, got torch.float32"),
    ("embedding_prefill_d64", "indices", torch.tensor([0, 100]), "holds 100, outside [0, 100)"),
    ("embedding_prefill_d64", "indices", torch.tensor([-5, 1], dtype=torch.int32), "holds -5"),
    ("rms_norm_llama_prefill", "x", torch.randn(1, 5, 6), "positive multiple of 4"),
    ("rms_norm_no_weight_qk_norm", "x", torch.randn(1, 3, 4, 32, dtype=torch.float64), "dtype torch.float64 is not supported"),
    ("rms_norm_llama_prefill", "weight", torch.randn(128), "of shape (256,)"),
    ("rms_norm_llama_prefill", "weight", torch.randn(256).half(), "x's dtype torch.float32"),
    ("rms_norm_llama_prefill", "eps", -1e-6, ">= 0"),
    ("rms_norm_llama_prefill", "eps", math.nan, "finite"),
    ("rms_norm_llama_prefill", "weight_offset", math.inf, "finite"),
    ("rope_prefill_d64", "x", torch.randn(5, 4, 64), "[B, S, H, D], got shape (5, 4, 64)"),
    ("rope_prefill_d64", "cos", torch.randn(1, 4, 64), "[B, S, R], [1, S, R] or [S, R] with (B, S) = (1, 5)"),
    ("rope_prefill_d64", "cos", torch.randn(64), "[B, S, R], [1, S, R] or [S, R]"),
    ("rope_prefill_d64", "cos", torch.randn(1, 5, 66), "R even and 0 < R <= D = 64, got R = 66"),
    ("rope_prefill_d64", "cos", torch.randn(1, 5, 7), "R even and 0 < R <= D = 64, got R = 7"),
    ("rope_prefill_d64", "sin", torch.randn(5, 64), "cos's shape (1, 5, 64)"),
    ("rope_prefill_d64", "cos", torch.randn(1, 5, 64).half(), "x's dtype"),
    ("act_mul_silu_mlp", "up", torch.randn(1, 5, 343), "gate's shape (1, 5, 344)"),
    ("act_mul_silu_mlp", "up", torch.randn(1, 5, 344).half(), "dtype torch.float32"),
    ("act_mul_silu_mlp", "activation", "relu", "'silu', 'gelu_tanh' or 'gelu', got 'relu'"),
    ("act_mul_silu_mlp", "gate", torch.zeros(1, 5, 344, dtype=torch.int8), "dtype torch.int8 is not supported",
     {"up": torch.zeros(1, 5, 344, dtype=torch.int8)}),
    ("binary_residual_add", "b", torch.randn(1, 5, 63), "does not broadcast to a's shape (1, 5, 64)"),
    ("binary_residual_add", "b", torch.randn(2, 1, 5, 64), "does not broadcast"),
    ("binary_residual_add", "b", torch.randn(1, 5, 64).half(), "a's dtype torch.float32"),
    ("binary_residual_add", "operation", "div", "'add', 'sub' or 'mul', got 'div'"),
    ("binary_residual_add", "operation", None, "expected a str"),
    ("scalar_add_third", "operation", "sub", "'add' or 'mul', got 'sub'"),
    ("scalar_add_third", "value", "0.5", "expected a float"),
    ("linear_prefill_bias", "x", torch.randn(1, 5, 0), "positive last dimension K, got shape (1, 5, 0)"),
    ("linear_prefill_bias", "x", torch.randn(1, 5, 96).double(), "dtype torch.float64 is not supported",
     {"weight": torch.randn(64, 96).double(), "bias": torch.randn(64).double()}),
    ("linear_prefill_bias", "weight", torch.randn(64, 95), "[N, K] with K = 96"),
    ("linear_prefill_bias", "weight", torch.randn(96), "[N, K] with K = 96"),
    ("linear_prefill_bias", "weight", torch.randn(64, 96).half(), "x's dtype torch.float32, got torch.float16"),
    ("linear_prefill_bias", "bias", torch.randn(63), "None or of shape (64,)"),
    ("linear_prefill_bias", "bias", torch.randn(64).half(), "x's dtype torch.float32, got torch.float16"),
]


@pytest.mark.parametrize("row", BAD_ARGS, ids=[f"{r[0]}-{r[1]}-{r[3][:20]}" for r in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(row):
    """Each row: case, argument, its bad value, text of the message (and other arguments
    changed alike, so that this one is the first wrong)."""
    case_name, arg, value, text, *others = row
    short, args = _args(case_name, {arg: value, **(others[0] if others else {})})
    op = op_of(short)
    assert_argument_error(op, args, arg, text)


def test_broadcasts_of_more_than_4_runs_are_refused():
    a, b = torch.randn(2, 3, 2, 3, 2, 3), torch.randn(3, 1, 3, 1, 3)
    with pytest.raises(ValueError, match=r"^etvk.binary.default: argument 'b'.* in 6 dimension runs"):
        op_of("binary")(a, b, "add")


# ---------------------------------------------------------------- linear's order


def linear_in_documented_order(x, weight, bias, workgroup=64):
    """docs/llm_ops.md's order of linear in fp32 torch ops (each rounded once, no fma):
    invocation lid sums the products of chunks lid, lid + 64, ... (4 K values each, zeros past
    K), a tree adds the 64 partial sums (span 32, 16, ..., 1), then the bias, then the dtype."""
    k = x.shape[-1]
    xs, w = x.reshape(-1, k).float(), weight.float()
    rounds = -(-k // (4 * workgroup))
    products = F.pad(xs[:, None, :] * w[None, :, :], (0, rounds * workgroup * 4 - k))
    products = products.reshape(xs.shape[0], w.shape[0], rounds, workgroup, 4)
    sums = torch.zeros(products.shape[:2] + (workgroup,))
    for r in range(rounds):
        for q in range(4):
            sums = sums + products[:, :, r, :, q]
    span = workgroup // 2
    while span:
        sums = torch.cat([sums[..., :span] + sums[..., span:2 * span], sums[..., span:]], -1)
        span //= 2
    out = sums[..., 0] if bias is None else sums[..., 0] + bias.float()
    return out.to(x.dtype).reshape(tuple(x.shape[:-1]) + (w.shape[0],))


@pytest.mark.parametrize("name", [c.name for c in CASES if c.op == "linear"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["float", "half"])
def test_linear_sums_in_the_documented_order(name, dtype):
    """The shader's fixed order, emulated in fp32 torch ops, gives its results bit for bit."""
    args = inputs(BY_NAME[name], dtype)
    bits = BITS[dtype]
    assert torch.equal(op_of("linear")(*args).view(bits), linear_in_documented_order(*args).view(bits))
