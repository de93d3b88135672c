"""Example arguments for every op, built from a variant's axis values and a shape.

For elementwise ops the shape is the input's; for the others it is a size
hint (linear: K and tokens; conv: which layer of `runtime.tools.examples_conv2d`, the
pointwise pair which of its `SE_PAIRS`;
pools, q8ta_linear, q8ta_binary, q8ta_channel_gather and the lookup tables: which case of
`runtime.tools.examples_q8ta_pool`, `runtime.tools.examples_q8ta_linear`,
`runtime.tools.examples_q8ta_binary`, `runtime.tools.examples_q8ta_gather` or
`runtime.tools.examples_q8ta_unary`;
q8ta_quantize and q8ta_dequantize: the width and the packed layout).

Shared by the tests (``tests/ops``), ``python -m runtime demo`` and the
benchmarks, so that all three exercise the same cases. The inputs are chosen
to hit the numerics that matter: rounding ties, saturation, narrow quant
ranges, per-token parameters, rows that are all positive, negative or zero.
Pure torch; no Vulkan.
"""

from __future__ import annotations

import math

import torch

from runtime.reference.attention import attention_tolerance
from runtime.tools import (
    examples_attention,
    examples_llm,
    examples_q8ta_binary,
    examples_q8ta_gather,
    examples_q8ta_unary,
)
from runtime.vulkan.layouts import PACKED_LAYOUTS

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
}

# A narrower range than the dtype's, so clamping at quant_min/quant_max is
# exercised apart from the dtype's own limits.
NARROW = {"int8": (-100, 90), "uint8": (10, 240), "int32": (-50000, 70000)}
ZERO_POINT = {"int8": 3, "uint8": 128, "int32": -1000}


def fp_input(shape, dtype, gen, scale):
    """Normal values plus exact rounding ties and values far outside the range."""
    x = torch.randn(shape, generator=gen) * 40 * scale
    flat = x.view(-1)
    n = flat.numel()
    if n >= 8:
        k = torch.arange(n // 4, dtype=torch.float32)
        flat[: n // 4] = (k - n // 8 + 0.5) * scale  # ties: (k + 0.5) * scale
        flat[-1] = 1e30
        flat[-2] = -1e30
    return x.to(dtype)


def per_token_params(shape, gen, out):
    tokens = math.prod(shape[:-1])
    token_shape = tuple(shape[:-1]) + (1,)
    scales = (torch.rand(tokens, generator=gen) * 0.2 + 1e-3).reshape(token_shape)
    lo, hi = NARROW[out]
    zps = torch.randint(lo, hi + 1, (tokens,), generator=gen).reshape(token_shape)
    return scales, zps.to(torch.int32)


def int_input(shape, dtype, gen):
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -(2**20)), min(info.max, 2**20)
    x = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64)
    return x.to(dtype)


def build_quantize_per_tensor(axes, shape, gen):
    out = axes["OUT_DTYPE"]
    scale = 0.0625 if shape and shape[-1] % 2 else 0.0371
    lo, hi = NARROW[out]
    x = fp_input(shape, DTYPES[axes["IN_DTYPE"]], gen, scale)
    return (x, scale, ZERO_POINT[out], lo, hi, DTYPES[out]), {}


def build_quantize_per_token(axes, shape, gen):
    out = axes["OUT_DTYPE"]
    scales, zps = per_token_params(shape, gen, out)
    lo, hi = NARROW[out]
    x = fp_input(shape, DTYPES[axes["IN_DTYPE"]], gen, 0.05)
    return (x, scales, zps, lo, hi, DTYPES[out]), {}


def build_dequantize_per_tensor(axes, shape, gen):
    q_dtype = DTYPES[axes["IN_DTYPE"]]
    info = torch.iinfo(q_dtype)
    q = int_input(shape, q_dtype, gen)
    zp = ZERO_POINT[axes["IN_DTYPE"]]
    return (q, 0.0371, zp, info.min, info.max, q_dtype), {"out_dtype": DTYPES[axes["OUT_DTYPE"]]}


def build_dequantize_per_token(axes, shape, gen):
    q_dtype = DTYPES[axes["IN_DTYPE"]]
    info = torch.iinfo(q_dtype)
    scales, zps = per_token_params(shape, gen, axes["IN_DTYPE"])
    q = int_input(shape, q_dtype, gen)
    return (q, scales, zps, info.min, info.max, q_dtype, DTYPES[axes["OUT_DTYPE"]]), {}


def build_choose_qparams(axes, shape, gen):
    x = torch.randn(shape, generator=gen) * 3
    rows = x.view(-1, shape[-1]) if x.numel() else x.view(0, 1)
    if rows.shape[0] >= 4:
        rows[0].abs_()  # all positive: min forced to 0
        rows[1] = -rows[1].abs()  # all negative: max forced to 0
        rows[2].zero_()  # all zero: scale = eps
        rows[3] += 50.0  # far from zero: zero point clamps
    return (x.to(DTYPES[axes["IN_DTYPE"]]), torch.int8), {}


def build_quantize_affine_dynamic(axes, shape, gen):
    """`build_choose_qparams`'s input with the eps torchao's 8da4w exports pass (fp32 eps)."""
    (x, _), _ = build_choose_qparams(axes, shape, gen)
    return (x, torch.finfo(torch.float32).eps), {}


def linear_args(lead, k, n, group_size, gen):
    """Arguments of ``etvk.linear_qta8a_qga4w`` for x of shape ``lead + (k,)`` and N = n.

    Full ranges everywhere: x and the zero points over all of int8, weights
    and weight zeros over [-8, 7], some negative weight scales, and a first
    token that hits the largest group sums (x = -128 with zero point 127).
    """
    from runtime.families.int4 import pack_int4

    tokens = math.prod(lead)
    groups = k // group_size
    x = torch.randint(-128, 128, (*lead, k), generator=gen, dtype=torch.int8)
    input_scale = torch.rand(*lead, 1, generator=gen) * 0.05 + 1e-3
    input_zero_point = torch.randint(-128, 128, (*lead, 1), generator=gen, dtype=torch.int32)
    w = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    weight_scales = (torch.rand(n, groups, generator=gen) - 0.1) * 0.02
    weight_zeros = torch.randint(-8, 8, (n, groups), generator=gen, dtype=torch.int32)
    if tokens and n:
        x.view(-1, k)[0] = -128
        input_zero_point.view(-1)[0] = 127
        w[0] = 7
        weight_zeros[0] = -8
    return (x, input_scale, input_zero_point, pack_int4(w), group_size, weight_scales, weight_zeros), {}


def build_linear_qta8a_qga4w(axes, shape, gen):
    """K is the last size rounded up to a multiple of 64 (at least 64), N = 20,
    group size 64 (every linear kernel takes it); gemv variants get one token, the
    others (gemm, the cooperative-matrix kernels, the dispatcher) at least two (or
    none, for an empty shape)."""
    k = max(64, -(-(shape[-1] if shape else 0) // 64) * 64)
    lead = tuple(shape[:-1])
    if axes.get("KERNEL") == "gemv":
        lead = (1,) * len(lead)
    elif math.prod(lead) == 1:
        lead = (2,) + lead[1:]
    return linear_args(lead, k, 20, 64, gen)


def build_conv2d(op_name):
    """A builder for a conv op: the first layer of the conv table the op accepts whose
    C_out is at least the shape's last size / 64 (so a bigger shape picks a bigger layer).

    The specialised im2col variant reads 4W4C input only, so for it x is a device
    tensor in that layout (the one place an example needs the device).
    """
    from runtime.tools.examples_conv2d import CASES, make_inputs

    accepts = {
        "etvk.q8ta_conv2d.default": lambda p: True,
        "etvk.q8ta_conv2d_general.default": lambda p: True,
        "etvk.q8ta_conv2d_im2col.default": lambda p: p.im2col_eligible,
        "etvk.q8ta_conv2d_pw.default": lambda p: p.is_pointwise,
        "etvk.q8ta_conv2d_im2col_coop.default": lambda p: p.im2col_coop_eligible,
        "etvk.q8ta_conv2d_pw_coop.default": lambda p: p.is_pointwise and p.groups == 1,
        "etvk.q8ta_conv2d_dw.default": lambda p: p.is_depthwise,
    }[op_name]

    def build(axes, shape, gen):
        want = (shape[-1] if shape else 0) // 64
        fits = [c for c in CASES if accepts(c.params)]
        case = next((c for c in fits if c.C_out >= want), fits[-1])
        args = list(make_inputs(case, seed=int(torch.randint(0, 2**31, (), generator=gen))).args())
        if axes.get("INPUT") == "4W4C":
            from runtime.vulkan.tensor import Tensor

            args[0] = Tensor.from_torch(args[0], layout="4W4C")
        return tuple(args), {}

    return build


def build_conv2d_pw_pair(axes, shape, gen):
    """EfficientNet-B0's gate pair (`runtime.tools.examples_conv2d.SE_PAIRS`) that the shape's
    last size picks (modulo the table's length), a table on both convs, N 2."""
    from runtime.tools.examples_conv2d import SE_PAIRS, make_pw_pair

    c, c_mid = SE_PAIRS[(shape[-1] if shape else 0) % len(SE_PAIRS)]
    seed = int(torch.randint(0, 2**31, (), generator=gen))
    x, kwargs = make_pw_pair(c, c_mid, c, 2, seed, activations=("none", "none"), luts=(True, True))
    return (x,), kwargs


def build_q8ta_pool(op_name):
    """A builder for a pool op: the case of its table (`runtime.tools.examples_q8ta_pool`)
    that the shape's last size picks (modulo the table's length), with a seed from ``gen``."""
    from runtime.tools import examples_q8ta_pool as pool

    cases, make = {
        "etvk.q8ta_max_pool2d.default": (pool.WINDOW_CASES, pool.max_pool_args),
        "etvk.q8ta_avg_pool2d.default": ([c for c in pool.WINDOW_CASES if c.is_avg],
                                         pool.avg_pool_args),
        "etvk.q8ta_window_sum.default": ([c for c in pool.WINDOW_CASES if c.full_windows],
                                         pool.window_sum_args),
        "etvk.q8ta_global_avg_pool2d.default": (pool.GLOBAL_CASES, pool.global_pool_args),
        "etvk.q8ta_adaptive_avg_pool2d.default": (pool.ADAPTIVE_CASES, pool.adaptive_pool_args),
    }[op_name]

    def build(axes, shape, gen):
        case = cases[(shape[-1] if shape else 0) % len(cases)]
        return make(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}

    return build


def q8ta_packed_case(shape) -> tuple[tuple[int, int, int, int], str]:
    """The [N, C, H, W] shape and packed layout of the q8ta_quantize / q8ta_dequantize
    examples: the width and the layout (the spec constant LAYOUT; `PACKED_LAYOUTS` in turn)
    follow the shape's last size."""
    last = max(1, shape[-1] if shape else 1)
    return (2, 5, 3, last % 13 + 1), PACKED_LAYOUTS[last % len(PACKED_LAYOUTS)]


def build_q8ta_quantize(axes, shape, gen):
    nchw, layout = q8ta_packed_case(shape)
    x = fp_input(nchw, DTYPES[axes["IN_DTYPE"]], gen, 0.05)
    return (x, 0.05, -3, layout), {}


def build_q8ta_dequantize(axes, shape, gen):
    nchw, layout = q8ta_packed_case(shape)
    q = int_input(nchw, torch.int8, gen)
    return (q, 0.05, -3, layout), {"out_dtype": DTYPES[axes["OUT_DTYPE"]]}


def build_q8ta_linear(axes, shape, gen):
    """The first case of `runtime.tools.examples_q8ta_linear` whose K is at least the
    shape's last size (the largest one otherwise); fp32 output for OUT_DTYPE float32."""
    from runtime.tools.examples_q8ta_linear import CASES, make_inputs

    want = shape[-1] if shape else 0
    case = next((c for c in CASES if c.K >= want), CASES[-1])
    seed = int(torch.randint(0, 2**31, (), generator=gen))
    return make_inputs(case, seed, fp32_output=axes.get("OUT_DTYPE") == "float32").args(), {}


LINEAR_OPS = (
    "etvk.linear_qta8a_qga4w.default",
    "etvk.linear_qta8a_qga4w_tiled.default",
    "etvk.linear_qta8a_qga4w_coop.default",
    "etvk.linear_qta8a_qga4w_coop_few.default",
)


def tolerance(op_name: str, want, args: tuple) -> float:
    """How far an op's output (for host arguments `args`) may be from its reference
    (OPS.md): 0 (bit-exact) for every op but linear_qta8a_qga4w (and the three it routes
    to), whose output may be 1e-5 of its largest magnitude away (fp32 sums of groups), the
    llm family's rms_norm, layer_norm and act_mul, whose relative and absolute tolerances
    (docs/llm_ops.md) are applied to the largest magnitude, the llm family's linear, whose
    per-output bound (`linear_bound`, docs/llm_ops.md) is taken at its largest,
    cache_attention, where the shader and the reference may each be `attention_tolerance`
    away from the exact result (docs/attention_ops.md), and rms_norm_quantize,
    add_rms_norm_quantize and act_mul_quantize: 2, as their float part is within its op's
    tolerance of the reference (their q may round one step away, and so may the zero point
    it adds; the fp32 scales differ far less than that; add_rms_norm_quantize's sum is exact)."""
    if op_name in LINEAR_OPS:
        return 1e-5 * float(want.abs().max()) if want.numel() else 0.0
    if op_name in ("etvk.rms_norm.default", "etvk.layer_norm.default", "etvk.act_mul.default"):
        from runtime.reference.llm import tolerance as llm_tolerance

        rtol, atol = llm_tolerance(op_name.split(".")[1], want.dtype)
        return rtol * float(want.abs().max()) + atol if want.numel() else 0.0
    if op_name == "etvk.linear.default":
        from runtime.reference.llm import linear_bound

        return float(linear_bound(*args).max()) if want.numel() else 0.0
    if op_name == "etvk.cache_attention.default":
        return 2 * attention_tolerance(*args)
    if op_name in ("etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default",
                   "etvk.act_mul_quantize.default"):
        return 2.0
    return 0.0


EXAMPLES = {
    "etvk.quantize_per_tensor.default": build_quantize_per_tensor,
    "etvk.quantize_per_token.default": build_quantize_per_token,
    "etvk.dequantize_per_tensor.default": build_dequantize_per_tensor,
    "etvk.dequantize_per_token.default": build_dequantize_per_token,
    "etvk.choose_qparams_per_token_asymmetric.default": build_choose_qparams,
    "etvk.quantize_per_token_dynamic.default": build_choose_qparams,
    "etvk.quantize_affine_per_token_dynamic.default": build_quantize_affine_dynamic,
    **{name: build_linear_qta8a_qga4w for name in LINEAR_OPS},
    "etvk.q8ta_quantize.default": build_q8ta_quantize,
    "etvk.q8ta_dequantize.default": build_q8ta_dequantize,
    "etvk.q8ta_linear.default": build_q8ta_linear,
    "etvk.q8ta_lut.default": examples_q8ta_unary.build,
    "etvk.q8ta_channel_lut.default": examples_q8ta_unary.build_channel,
    "etvk.q8ta_channel_lut_mean.default": examples_q8ta_unary.build_channel_mean,
    "etvk.q8ta_channel_gather.default": examples_q8ta_gather.build,
    **{
        name: examples_q8ta_binary.build(name)
        for name in ("etvk.q8ta_add.default", "etvk.q8ta_mul.default", "etvk.q8ta_concat.default",
                     "etvk.q8ta_concat_channel_lut.default")
    },
    **{
        name: build_conv2d(name)
        for name in (
            "etvk.q8ta_conv2d.default",
            "etvk.q8ta_conv2d_im2col.default",
            "etvk.q8ta_conv2d_general.default",
            "etvk.q8ta_conv2d_pw.default",
            "etvk.q8ta_conv2d_im2col_coop.default",
            "etvk.q8ta_conv2d_pw_coop.default",
            "etvk.q8ta_conv2d_dw.default",
        )
    },
    "etvk.q8ta_conv2d_pw_pair.default": build_conv2d_pw_pair,
    **{f"etvk.{op}.default": examples_llm.build(f"etvk.{op}.default") for op in examples_llm.OPS},
    "etvk.cast.default": examples_llm.build_cast,
    **{
        name: examples_attention.build(name)
        for name in ("etvk.cache_attention.default", "etvk.cache_update.default",
                     "etvk.rope_cache_update.default")
    },
    **{
        name: build_q8ta_pool(name)
        for name in (
            "etvk.q8ta_max_pool2d.default",
            "etvk.q8ta_avg_pool2d.default",
            "etvk.q8ta_window_sum.default",
            "etvk.q8ta_global_avg_pool2d.default",
            "etvk.q8ta_adaptive_avg_pool2d.default",
        )
    },
}
