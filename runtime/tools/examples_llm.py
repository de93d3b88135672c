"""Example cases of the llm family (embedding, rms_norm, layer_norm, rope, act_mul, binary, scalar, linear,
rms_norm_quantize, act_mul_quantize), as tables, and the arguments of its cast (`build_cast`).

Each case names a shape from a decoder LLM (shrunk so that it runs quickly on a
CPU Vulkan driver) or one that stresses the indexing: sizes that are not
multiples of 4 (values of one unit straddle rows), head sizes whose halves are
not whole units, rotary embeddings of part of each head, broadcasts of every kind, empty tensors, linears whose K is
not a multiple of the chunk of 4 or of a workgroup's 256 values; the fused ops' rows are
also longer than their shaders keep in registers. `inputs(case, dtype)` builds the
arguments in schema order. Used by the tests (tests/ops/test_llm.py)
and, through runtime/tools/examples.py, the demo. Pure torch; no Vulkan.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace

import torch


@dataclass(frozen=True)
class Case:
    """One call: the op (its short name), the shapes it needs, and its string/float options."""

    name: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    options: dict = field(default_factory=dict)


CASES = [
    # embedding: shapes = (weight [V, D], indices)
    Case("embedding_prefill_d64", "embedding", ((100, 64), (1, 7))),
    Case("embedding_decode_d64_int64", "embedding", ((100, 64), (1, 1)), {"index_dtype": torch.int64}),
    Case("embedding_d6_rows_straddle_units", "embedding", ((33, 6), (2, 5))),
    Case("embedding_d1", "embedding", ((9, 1), (11,)), {"index_dtype": torch.int64}),
    Case("embedding_0d_indices", "embedding", ((20, 8), ())),
    Case("embedding_empty_indices", "embedding", ((20, 8), (0, 3))),
    # rms_norm: shapes = (x, weight or ()), options eps, weight_offset
    Case("rms_norm_llama_prefill", "rms_norm", ((1, 5, 256), (256,)), {"eps": 1e-6}),
    Case("rms_norm_decode_d576", "rms_norm", ((1, 1, 576), (576,)), {"eps": 1e-5}),
    Case("rms_norm_gemma_offset", "rms_norm", ((2, 3, 128), (128,)), {"eps": 1e-6, "weight_offset": 1.0}),
    Case("rms_norm_no_weight_qk_norm", "rms_norm", ((1, 3, 4, 32), ()), {"eps": 1e-6}),
    Case("rms_norm_d4_many_rows", "rms_norm", ((300, 4), (4,)), {"eps": 1e-6}),
    Case("rms_norm_d200_eps0", "rms_norm", ((2, 200), (200,)), {"eps": 0.0}),
    # layer_norm: shapes = (x, weight or (), bias or ()), option eps
    Case("layer_norm_prefill", "layer_norm", ((1, 5, 256), (256,), (256,)), {"eps": 1e-5}),
    Case("layer_norm_decode_d576", "layer_norm", ((1, 1, 576), (576,), (576,)), {"eps": 1e-5}),
    Case("layer_norm_no_affine_olmo", "layer_norm", ((3, 2, 200), (), ()), {"eps": 1e-5}),
    Case("layer_norm_weight_only", "layer_norm", ((300, 4), (4,), ()), {"eps": 1e-6}),
    Case("layer_norm_d4160_rows", "layer_norm", ((3, 4160), (4160,), (4160,)), {"eps": 1e-5}),
    # rope: shapes = (x [B, S, H, D], cos)
    Case("rope_prefill_d64", "rope", ((1, 5, 4, 64), (1, 5, 64))),
    Case("rope_batch2_d32", "rope", ((2, 3, 2, 32), (2, 3, 32))),
    Case("rope_batch2_shared_rows", "rope", ((2, 3, 2, 16), (3, 16))),
    Case("rope_batch_broadcast_cos", "rope", ((2, 2, 3, 8), (1, 2, 8))),
    Case("rope_d12_halves_straddle_units", "rope", ((1, 3, 2, 12), (1, 3, 12))),
    Case("rope_d6_heads_straddle_units", "rope", ((2, 2, 3, 6), (2, 2, 6))),
    Case("rope_decode_d128", "rope", ((1, 1, 2, 128), (1, 128))),
    # partial rotary: cos [.., R] with R < D, the last D - R values of each head passed through
    Case("rope_partial_half_d32", "rope", ((1, 3, 2, 32), (1, 3, 16))),
    Case("rope_partial_batch2_d16_r8", "rope", ((2, 2, 3, 16), (2, 2, 8))),
    Case("rope_partial_d80_r20_halves_straddle_units", "rope", ((1, 2, 2, 80), (2, 20))),
    Case("rope_partial_d10_r6_units_straddle_the_tail", "rope", ((2, 2, 3, 10), (1, 2, 6))),
    # act_mul: shapes = (gate,), option activation
    Case("act_mul_silu_mlp", "act_mul", ((1, 5, 344),), {"activation": "silu"}),
    Case("act_mul_gelu_tanh_gemma", "act_mul", ((2, 3, 96),), {"activation": "gelu_tanh"}),
    Case("act_mul_gelu_erf", "act_mul", ((7, 33),), {"activation": "gelu"}),
    Case("act_mul_silu_odd_numel", "act_mul", ((3, 7),), {"activation": "silu"}),
    Case("act_mul_gelu_tails", "act_mul", ((4001,),), {"activation": "gelu", "tails": True}),
    Case("act_mul_gelu_tanh_tails", "act_mul", ((4001,),), {"activation": "gelu_tanh", "tails": True}),
    Case("act_mul_silu_tails", "act_mul", ((4001,),), {"activation": "silu", "tails": True}),
    Case("act_mul_empty", "act_mul", ((0, 8),), {"activation": "silu"}),
    # binary: shapes = (a, b), option operation
    Case("binary_residual_add", "binary", ((1, 5, 64), (1, 5, 64)), {"operation": "add"}),
    Case("binary_norm_weight_mul", "binary", ((1, 5, 64), (64,)), {"operation": "mul"}),
    Case("binary_scalar_tensor_sub", "binary", ((2, 3, 5), ()), {"operation": "sub"}),
    Case("binary_per_token_mul", "binary", ((2, 3, 10), (2, 3, 1)), {"operation": "mul"}),
    Case("binary_leading_broadcast_add", "binary", ((4, 3, 6), (1, 3, 6)), {"operation": "add"}),
    Case("binary_mixed_broadcast_sub", "binary", ((2, 3, 4, 5), (2, 1, 4, 1)), {"operation": "sub"}),
    Case("binary_4_runs_mul", "binary", ((3, 2, 3, 5), (3, 1, 3, 1)), {"operation": "mul"}),
    Case("binary_odd_numel_add", "binary", ((7,), (1,)), {"operation": "add"}),
    Case("binary_empty_mul", "binary", ((0, 4), (4,)), {"operation": "mul"}),
    # scalar: shapes = (a,), options value, operation
    Case("scalar_embedding_scale_mul", "scalar", ((1, 5, 64),), {"value": 48.0 ** 0.5, "operation": "mul"}),
    Case("scalar_logit_softcap_mul", "scalar", ((2, 3, 9),), {"value": 1 / 30.0, "operation": "mul"}),
    Case("scalar_add_third", "scalar", ((3, 11),), {"value": 1 / 3, "operation": "add"}),
    Case("scalar_add_tie_in_fp16", "scalar", ((2, 8),), {"value": 1 + 2.0**-11 + 2.0**-40, "operation": "add"}),
    # linear: shapes = (x [..., K], (N,)), option bias
    Case("linear_decode_lm_head", "linear", ((1, 1, 256), (200,)), {"bias": False}),
    Case("linear_prefill_bias", "linear", ((1, 5, 96), (64,)), {"bias": True}),
    Case("linear_k70_n13_rows_straddle_units", "linear", ((3, 70), (13,)), {"bias": True}),
    Case("linear_decode_k1000", "linear", ((1, 1000), (8,)), {"bias": False}),
    Case("linear_k1_1d_bias", "linear", ((2, 1), (5,)), {"bias": True}),
    Case("linear_1d_x_k33", "linear", ((33,), (6,)), {"bias": False}),
    Case("linear_no_tokens", "linear", ((0, 16), (8,)), {"bias": True}),
]
# The fused ops (fp32 only): their float op's shapes and options (above) and quant_eps, the
# smallest scale (default fp32's eps, as torchao's 8da4w exports pass); add_rms_norm_quantize
# takes rms_norm's and a residual of x's shape.
FUSED = {"rms_norm_quantize": "rms_norm", "act_mul_quantize": "act_mul", "add_rms_norm_quantize": "rms_norm"}
QUANTIZE_CASES = [
    Case("rms_norm_quantize_llama_prefill", "rms_norm_quantize", ((1, 5, 256), (256,)), {"eps": 1e-6}),
    Case("rms_norm_quantize_decode_d2048", "rms_norm_quantize", ((1, 1, 2048), (2048,)), {"eps": 1e-5}),
    # rows of 1040 units: past the 16 units x 64 invocations kept in registers
    Case("rms_norm_quantize_d4160_reread", "rms_norm_quantize", ((3, 4160), (4160,)), {"eps": 1e-6}),
    Case("rms_norm_quantize_gemma_offset", "rms_norm_quantize", ((2, 3, 128), (128,)),
         {"eps": 1e-6, "weight_offset": 1.0}),
    Case("rms_norm_quantize_no_weight", "rms_norm_quantize", ((1, 3, 4, 32), ()), {"eps": 1e-6}),
    Case("rms_norm_quantize_d4_many_rows", "rms_norm_quantize", ((300, 4), (4,)),
         {"eps": 1e-6, "quant_eps": 0.01}),
    Case("rms_norm_quantize_no_tokens", "rms_norm_quantize", ((0, 64), (64,)), {"eps": 1e-6}),
    Case("add_rms_norm_quantize_decode_d2048", "add_rms_norm_quantize", ((1, 1, 2048), (2048,)), {"eps": 1e-5}),
    Case("add_rms_norm_quantize_d4160_reread", "add_rms_norm_quantize", ((3, 4160), (4160,)), {"eps": 1e-6}),
    Case("add_rms_norm_quantize_gemma_offset", "add_rms_norm_quantize", ((2, 3, 128), (128,)),
         {"eps": 1e-6, "weight_offset": 1.0}),
    Case("add_rms_norm_quantize_no_weight", "add_rms_norm_quantize", ((4, 36), ()), {"eps": 1e-6}),
    Case("add_rms_norm_quantize_no_tokens", "add_rms_norm_quantize", ((0, 64), (64,)), {"eps": 1e-6}),
    Case("act_mul_quantize_silu_mlp", "act_mul_quantize", ((1, 5, 344),), {"activation": "silu"}),
    Case("act_mul_quantize_gelu_tanh_gemma", "act_mul_quantize", ((2, 3, 96),), {"activation": "gelu_tanh"}),
    Case("act_mul_quantize_gelu_erf", "act_mul_quantize", ((7, 36),), {"activation": "gelu"}),
    # rows of 4100 units: past the 16 units x 256 invocations kept in registers
    Case("act_mul_quantize_silu_d16400_reread", "act_mul_quantize", ((2, 16400),), {"activation": "silu"}),
    Case("act_mul_quantize_silu_tails", "act_mul_quantize", ((4000,),),
         {"activation": "silu", "tails": True, "quant_eps": 2.0**-64}),
    Case("act_mul_quantize_no_tokens", "act_mul_quantize", ((0, 8),), {"activation": "silu"}),
]
BY_NAME = {case.name: case for case in CASES + QUANTIZE_CASES}
OPS = ("embedding", "rms_norm", "layer_norm", "rope", "act_mul", "binary", "scalar", "linear", *FUSED)


def _values(gen, shape, dtype, scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def inputs(case: Case, dtype: torch.dtype, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.<case.op>.default`` for ``case`` with activations of ``dtype``."""
    if case.op in FUSED:
        quant_eps = case.options.get("quant_eps", torch.finfo(torch.float32).eps)
        args = inputs(replace(case, op=FUSED[case.op]), dtype, seed)
        if case.op == "add_rms_norm_quantize":  # the residual, after x
            base = zlib.crc32(case.name.encode()) if seed is None else seed
            residual = _values(torch.Generator().manual_seed(base + 1), case.shapes[0], dtype, 3.0)
            args = (args[0], residual, *args[1:])
        return (*args, quant_eps)
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) if seed is None else seed)
    o = case.options
    if case.op == "embedding":
        (v, d), index_shape = case.shapes
        indices = torch.randint(0, v, index_shape, generator=gen, dtype=torch.int64)
        if indices.numel() >= 2:  # the first and last row of the table
            indices.view(-1)[0], indices.view(-1)[-1] = 0, v - 1
        return _values(gen, (v, d), dtype), indices.to(o.get("index_dtype", torch.int32))
    if case.op == "rms_norm":
        x_shape, w_shape = case.shapes
        x = _values(gen, x_shape, dtype, 3.0)
        if x.shape[0] >= 3:
            x[1] = 0  # an all-zero row: y = 0
            x[2] *= 100  # large values: their squares far above 1
        weight = _values(gen, w_shape, dtype) if w_shape else None
        return x, weight, o["eps"], o.get("weight_offset", 0.0)
    if case.op == "layer_norm":
        x_shape, w_shape, b_shape = case.shapes
        x = _values(gen, x_shape, dtype, 3.0) + 2.0  # rows whose mean is not 0
        if x.shape[0] >= 3:
            x[1] = 7.0  # a constant row: its mean exact (7 * D / D), x - mean = 0, out = bias
            x[2] *= 100  # large values: their squares far above 1
        weight = _values(gen, w_shape, dtype) if w_shape else None
        bias = _values(gen, b_shape, dtype) if b_shape else None
        return x, weight, bias, o["eps"]
    if case.op == "rope":
        x_shape, cos_shape = case.shapes
        angles = torch.rand(cos_shape, generator=gen) * 6.3
        return _values(gen, x_shape, dtype, 2.0), angles.cos().to(dtype), angles.sin().to(dtype)
    if case.op == "act_mul":
        (shape,) = case.shapes
        if o.get("tails"):  # [-100, 100], the far tails included: no NaN, limits x and -0
            gate = torch.linspace(-100, 100, shape[0]).to(dtype)
        else:
            gate = _values(gen, shape, dtype, 4.0)
        return gate, _values(gen, shape, dtype), o["activation"]
    if case.op == "binary":
        a_shape, b_shape = case.shapes
        return _values(gen, a_shape, dtype), _values(gen, b_shape, dtype), o["operation"]
    if case.op == "linear":
        x_shape, (n,) = case.shapes
        weight = _values(gen, (n, x_shape[-1]), dtype, x_shape[-1] ** -0.5)
        bias = _values(gen, (n,), dtype) if o["bias"] else None
        return _values(gen, x_shape, dtype), weight, bias
    (shape,) = case.shapes
    return _values(gen, shape, dtype, 5.0), o["value"], o["operation"]


def build_cast(axes, shape, gen):
    """Arguments of ``etvk.cast.default`` for a variant: values of IN_DTYPE (zeros, a tie
    between two fp16 values, one past fp16's range among them) to OUT_DTYPE."""
    dtypes = {"float32": torch.float32, "float16": torch.float16}
    x = torch.randn(shape, generator=gen) * 100
    x.view(-1)[:3] = torch.tensor([0.0, 1 + 2.0**-11, 7e4])[:x.numel()]
    return (x.to(dtypes[axes["IN_DTYPE"]]), dtypes[axes["OUT_DTYPE"]]), {}


def build(op_name: str):
    """A builder for ``runtime.tools.examples.EXAMPLES``: the case of the op's table at
    index (the shape's last size mod the table's length), in the variant's DTYPE."""
    short = op_name.split(".")[1]
    cases = [c for c in CASES + QUANTIZE_CASES if c.op == short]

    def builder(axes, shape, gen):
        case = cases[(shape[-1] if shape else 0) % len(cases)]
        dtype = {"float32": torch.float32, "float16": torch.float16}[axes.get("DTYPE", "float32")]
        return inputs(case, dtype, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}

    return builder
