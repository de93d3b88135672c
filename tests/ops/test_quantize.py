"""Quantize family (OPS.md family 1): every generated variant against the fp32
reference (bit-exact) and against PyTorch's quantized_decomposed ops where
OPS.md says so, on the default Vulkan device with the validation layer on.

Cases are tables: `EXAMPLES` makes the arguments of each op from a variant's
axis values and a shape; `SHAPES` are the shapes every variant runs.
"""

from __future__ import annotations

import json
import math
import zlib

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

import runtime
from runtime.ops.library import catalog
from runtime.reference import quantize as ref
from runtime.tools.examples import (
    DTYPES,
    EXAMPLES,
    NARROW,
    ZERO_POINT,
    fp_input,
    int_input,
    per_token_params,
)
from runtime.tools.quantize_tunables import (
    CANDIDATES,
    CHOOSE_CANDIDATES,
    DYNAMIC_CANDIDATES,
    UnitsStream,
    record_token_shader,
)
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

# Shapes every variant runs: 0-d, empty, widths that are and are not
# multiples of 4, several leading dimensions; tokens of 24 values straddle the
# 16 values a per-token buffer invocation takes, and 1040 / 1030 values reach
# choose_qparams' four-loads step (more than 4 x 64 units) with and without whole units.
SHAPES = [(), (0,), (3, 0), (0, 5), (1,), (7,), (3, 5), (2, 3, 17), (4, 64), (2, 2, 3, 10),
          (5, 24), (3, 1040), (2, 1030)]

# Shapes every UNITS candidate runs: several workgroup blocks with a short last one (a
# buffer block is 256 * UNITS units, a texture block 16 * UNITS texels of a row), tokens
# that straddle units and blocks (K % 4 != 0, K below 4), blocks with more tokens than a
# workgroup has invocations (reciprocals not cached), 9 rows of texels (a second
# workgroup of 8 rows) and one long token.
UNITS_SHAPES = [(3, 1030), (5, 1031), (700, 3), (300, 5), (600, 8), (2, 9, 70), (2100,)]

# Shapes an op rejects by design (tested under bad inputs instead).
REJECTED = {"etvk.choose_qparams_per_token_asymmetric.default": {(), (0,), (3, 0)}}
# The fused op also needs tokens of whole units of 4 values.
REJECTED["etvk.quantize_per_token_dynamic.default"] = {
    *REJECTED["etvk.choose_qparams_per_token_asymmetric.default"], *(s for s in SHAPES if s and s[-1] % 4)}
REJECTED["etvk.quantize_affine_per_token_dynamic.default"] = REJECTED["etvk.quantize_per_token_dynamic.default"]


QUANTIZE_OPS = [op for op in EXAMPLES if runtime.get_op(op).opdef.family == "quantize"]


def _variants():
    return [
        pytest.param(op, info.name, id=info.name)
        for op in QUANTIZE_OPS
        for info in runtime.get_op(op).variants
    ]


def assert_bit_equal(actual, expected, what):
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.is_floating_point:
        bits = {torch.float32: torch.int32, torch.float16: torch.int16}[actual.dtype]
        actual, expected = actual.view(bits), expected.view(bits)
    mismatch = (actual != expected).sum().item()
    assert mismatch == 0, f"{what}: {mismatch} of {actual.numel()} values differ"


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize(("op_name", "variant"), _variants())
def test_variant_matches_reference(op_name, variant, dispatch_trace):
    op = runtime.get_op(op_name)
    axes = next(v.axes for v in op.variants if v.name == variant)
    gen = torch.Generator().manual_seed(zlib.crc32(variant.encode()))
    for shape in SHAPES:
        if shape in REJECTED.get(op_name, ()):
            continue
        args, kwargs = EXAMPLES[op_name](axes, shape, gen)
        got = as_tuple(op(*args, **kwargs, variant=variant))
        want = as_tuple(op.reference(*args, **kwargs))
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_bit_equal(g, w, f"{variant} shape={shape} output {i}")
    assert variant in dispatch_trace(), f"{variant} never reached the device"


@pytest.mark.parametrize("units", sorted({*CANDIDATES, 3}))
@pytest.mark.parametrize(("op_name", "variant"), [
    p for p in _variants() if "UNITS" in {s.name for s in catalog().variant(p.values[1]).interface.spec_constants}])
def test_every_units_candidate_matches_reference(op_name, variant, units):
    """Each value of the UNITS spec constant the benchmark sweeps (and 3, not a power of 2)."""
    op = runtime.get_op(op_name)
    axes = next(v.axes for v in op.variants if v.name == variant)
    gen = torch.Generator().manual_seed(zlib.crc32(variant.encode()) + units)
    for shape in UNITS_SHAPES:
        args, kwargs = EXAMPLES[op_name](axes, shape, gen)
        with UnitsStream(units) as stream:
            got = op.record(stream, *args, **kwargs, variant=variant)
            stream.run()
            got = got.to_torch()
        want = op.reference(*args, **kwargs)
        assert_bit_equal(got, want, f"{variant} UNITS={units} shape={shape}")


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize("in_dtype", ["float32", "float16"])
@pytest.mark.parametrize("op_name, spec, candidates", [
    ("etvk.choose_qparams_per_token_asymmetric.default", "REDUCERS", CHOOSE_CANDIDATES),
    ("etvk.quantize_per_token_dynamic.default", "REGS", DYNAMIC_CANDIDATES),
])
def test_per_token_shaders_every_team(storage, in_dtype, op_name, spec, candidates):
    """Each (workgroup size, LANES, REDUCERS or REGS) the benchmark sweeps, and odd ones (sizes
    that are not powers of 2, a last team cut short, LANES over the workgroup), on tokens with
    and without whole units, longer than the loads an invocation keeps, and counts of tokens
    that leave a workgroup's last teams without one."""
    op = runtime.get_op(op_name)
    info = next(v for v in op.variants if v.axes == {"STORAGE": storage, "IN_DTYPE": in_dtype})
    reference = (ref.choose_qparams_per_token_asymmetric if "choose" in op_name
                 else ref.quantize_per_token_dynamic)
    names = ["t_scales", "t_zero_points"] if "choose" in op_name else ["t_out", "t_scales", "t_zero_points"]
    gen = torch.Generator().manual_seed(19)
    shapes = ((3, 1040), (2, 1032), (5, 16), (9, 8)) if "dynamic" in op_name else (
        (3, 1040), (2, 1030), (5, 17), (9, 3))
    for shape in shapes:
        x = (torch.randn(shape, generator=gen) * 3).to(DTYPES[in_dtype])
        device_x = Tensor.from_torch(x, storage)
        want = reference(x, torch.int8)
        for workgroup, lanes, value in (*candidates, (48, 16, 5), (1, 1, 1), (7, 16, 2), (7, 3, 2)):
            with Stream() as stream:
                outputs = record_token_shader(stream, info, op_name, device_x, workgroup, lanes,
                                              {spec: value})
                stream.run()
                got = [outputs[name].to_torch().reshape(w.shape) for name, w in zip(names, want, strict=True)]
            for name, g, w in zip(names, got, want, strict=True):
                assert_bit_equal(g, w, f"{info.name} {shape} workgroup={workgroup} LANES={lanes} "
                                       f"{spec}={value} {name}")


def _quantized_decomposed(op_name):
    return getattr(torch.ops.quantized_decomposed, op_name.split(".")[1])


@pytest.mark.parametrize("in_dtype", ["float32", "float16"])
@pytest.mark.parametrize("out_dtype", ["int8", "uint8", "int32"])
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_quantize_per_tensor_bit_identical_to_pytorch(in_dtype, out_dtype, storage):
    gen = torch.Generator().manual_seed(7)
    op = runtime.get_op("etvk.quantize_per_tensor.default")
    lo, hi = NARROW[out_dtype]
    # Python-float scales that are not fp32 values: the reciprocal must round like PyTorch's.
    for scale in (0.05, 0.0371, 1 / 3, 0.0625, 7.3e-3):
        x = fp_input((5, 33), DTYPES[in_dtype], gen, scale)
        args = (x, scale, ZERO_POINT[out_dtype], lo, hi, DTYPES[out_dtype])
        want = _quantized_decomposed("etvk.quantize_per_tensor.default")(*args)
        assert_bit_equal(op(*args, storage=storage), want, f"scale={scale}")


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize("q_dtype", ["int8", "uint8"])
@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_dequantize_bit_identical_to_pytorch(storage, q_dtype, out_dtype):
    gen = torch.Generator().manual_seed(11)
    info = torch.iinfo(DTYPES[q_dtype])
    q = int_input((6, 21), DTYPES[q_dtype], gen)
    per_tensor = runtime.get_op("etvk.dequantize_per_tensor.default")
    args = (q, 0.0371, ZERO_POINT[q_dtype], info.min, info.max, DTYPES[q_dtype])
    kwargs = {"out_dtype": DTYPES[out_dtype]}
    want = torch.ops.quantized_decomposed.dequantize_per_tensor(*args, **kwargs)
    assert_bit_equal(per_tensor(*args, **kwargs, storage=storage), want, "per tensor")

    per_token = runtime.get_op("etvk.dequantize_per_token.default")
    scales, zps = per_token_params((6, 21), gen, q_dtype)
    args = (q, scales, zps, info.min, info.max, DTYPES[q_dtype], DTYPES[out_dtype])
    want = torch.ops.quantized_decomposed.dequantize_per_token(*args)
    assert_bit_equal(per_token(*args, storage=storage), want, "per token")


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_per_token_pipeline_within_one_step_of_pytorch(storage):
    """choose_qparams + quantize_per_token against PyTorch's versions: OPS.md allows one step."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(37, 130, generator=gen) * 4 + 1
    choose = runtime.get_op("etvk.choose_qparams_per_token_asymmetric.default")
    scales, zps = choose(x, torch.int8, storage=storage)
    pt_scales, pt_zps = torch.ops.quantized_decomposed.choose_qparams_per_token_asymmetric(
        x, torch.int8
    )
    assert torch.allclose(scales.double(), pt_scales, rtol=2**-23, atol=0)
    assert (zps.long() - pt_zps).abs().max() <= 1

    quantize = runtime.get_op("etvk.quantize_per_token.default")
    q = quantize(x, scales, zps, -128, 127, torch.int8, storage=storage)
    pt_q = torch.ops.quantized_decomposed.quantize_per_token(x, scales, zps, -128, 127, torch.int8)
    steps = (q.int() - pt_q.int()).abs()
    assert steps.max() <= 1
    exact = (steps == 0).float().mean().item()
    assert exact >= 0.999, f"only {exact:.4%} of values equal PyTorch's"


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_divisions_are_correctly_rounded_over_many_tokens(storage):
    """Scales and reciprocals of 8192 tokens: near-midpoint quotients occur about once in
    a thousand, and an fma-based division (unfused on some drivers) gets them wrong."""
    gen = torch.Generator().manual_seed(13)
    # 2 x 4096 rows: a texture's height stays within lavapipe's 4096-texel limit.
    x = torch.randn(2, 4096, 24, generator=gen) * torch.rand(2, 4096, 1, generator=gen) * 10
    choose = runtime.get_op("etvk.choose_qparams_per_token_asymmetric.default")
    got = choose(x, torch.int8, storage=storage)
    want = ref.choose_qparams_per_token_asymmetric(x, torch.int8)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_bit_equal(g, w, f"choose_qparams output {i}")
    fused = runtime.get_op("etvk.quantize_per_token_dynamic.default")(x, torch.int8, storage=storage)
    for i, (g, w) in enumerate(zip(fused, ref.quantize_per_token_dynamic(x, torch.int8), strict=True)):
        assert_bit_equal(g, w, f"quantize_per_token_dynamic output {i}")
    quantize = runtime.get_op("etvk.quantize_per_token.default")
    scales = torch.rand(2, 4096, 1, generator=gen) * 0.5 + 1e-4
    zps = torch.zeros(2, 4096, 1, dtype=torch.int32)
    # x / scale lands near .5 often: every reciprocal must be the correctly rounded one.
    xs = (torch.randint(-60, 60, (2, 4096, 24), generator=gen) + 0.5) * scales
    got = quantize(xs, scales, zps, -128, 127, torch.int8, storage=storage)
    assert_bit_equal(got, ref.quantize_per_token(xs, scales, zps, -128, 127, torch.int8), "quantize")


# Rows of 24 values for the torchao comparison: name -> (gen, rows) -> [rows, 24] fp32.
K_AFFINE = 24


def _power_of_2_scales(gen, rows):
    """(scale 2**-k, m): a row from -m * scale to (255 - m) * scale has exactly that scale."""
    return 2.0 ** -torch.randint(-3, 12, (rows, 1), generator=gen).float(), \
        torch.randint(0, 256, (rows, 1), generator=gen).float()


def _quantize_ties(gen, rows):
    """Every value after the two ends is an exact rounding tie of x / scale."""
    scale, m = _power_of_2_scales(gen, rows)
    n = torch.randint(0, 255, (rows, K_AFFINE), generator=gen).float()
    x = (n - m + 0.5) * scale
    x[:, 0], x[:, 1] = (-m * scale)[:, 0], ((255 - m) * scale)[:, 0]
    return x


def _zero_point_ties(gen, rows):
    """min / scale is an exact tie: -(m + 0.5) * scale to (254.5 - m) * scale, m < 255."""
    scale, m = _power_of_2_scales(gen, rows)
    m = m.clamp(max=254)
    x = (torch.rand(rows, K_AFFINE, generator=gen) * 255 - m - 0.5) * scale
    x[:, 0], x[:, 1] = (-(m + 0.5) * scale)[:, 0], ((254.5 - m) * scale)[:, 0]
    return x


def _near_ties(gen, rows):
    """Any scale, values (n + 0.5) * scale rounded to fp32: x * (1 / scale) lands next to ties."""
    lo = -torch.rand(rows, 1, generator=gen) * 20
    hi = torch.rand(rows, 1, generator=gen) * 20
    scale = (hi - lo) / 255.0
    n = torch.randint(0, 255, (rows, K_AFFINE), generator=gen).float() + torch.round(lo / scale)
    x = torch.minimum(torch.maximum((n + 0.5) * scale, lo), hi)
    x[:, 0], x[:, 1] = lo[:, 0], hi[:, 0]
    return x


def _constant_rows(gen, rows):
    """All values equal: positive, negative, tiny and huge."""
    values = torch.tensor([3.0, -3.0, 1e-30, -1e-30, 2e37, -2e37, 2.5, -0.0])
    return values[torch.randint(0, len(values), (rows, 1), generator=gen)].expand(rows, K_AFFINE).clone()


AFFINE_ROWS = {
    "random": lambda gen, rows: torch.randn(rows, K_AFFINE, generator=gen) * torch.rand(rows, 1, generator=gen) * 10,
    "quantize ties": _quantize_ties,
    "zero-point ties": _zero_point_ties,
    "near ties": _near_ties,
    "constant": _constant_rows,
    "zeros": lambda gen, rows: torch.zeros(rows, K_AFFINE),
    "large range": lambda gen, rows: (torch.rand(rows, K_AFFINE, generator=gen) - 0.5) * 2e37,
    "large one-sided": lambda gen, rows: torch.rand(rows, K_AFFINE, generator=gen) * 2e37,
    # max - min up to 3e38, near fp32's largest: the scale above 2**113, 1 / scale below 2**-113
    # (etvk_div_rn scales its operands first: unscaled, its Veltkamp splits overflowed here)
    "huge range": lambda gen, rows: (torch.rand(rows, K_AFFINE, generator=gen) - 0.5) * 3e38,
    "huge one-sided": lambda gen, rows: torch.rand(rows, K_AFFINE, generator=gen) * 3e38,
    "tiny (scale = eps)": lambda gen, rows: torch.randn(rows, K_AFFINE, generator=gen) * 1e-30,
    "far from zero (zero point clamps)": lambda gen, rows: torch.randn(rows, K_AFFINE, generator=gen) + 50,
}


@pytest.mark.parametrize("eps", [torch.finfo(torch.float32).eps, 2.0**-64, 0.01])
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_affine_dynamic_quantize_bit_identical_to_torchao(storage, eps):
    """quantize_affine_per_token_dynamic against the reference and against torchao's own
    choose_qparams_affine + quantize_affine (as 8da4w exports call them), bit for bit."""
    pytest.importorskip("torchao", reason="the comparison needs torchao's ops")
    gen = torch.Generator().manual_seed(23)
    op = runtime.get_op("etvk.quantize_affine_per_token_dynamic.default")
    for name, rows in AFFINE_ROWS.items():
        x = rows(gen, 2048 if name == "random" else 256).reshape(2, -1, K_AFFINE)
        _check_affine_against_torchao(op, x, eps, storage, name)


def _check_affine_against_torchao(op, x, eps, storage, name: str):
    """The op's (q, scales, zero points) on `x`, checked bit for bit against the reference and
    against torchao's choose_qparams_affine + quantize_affine; returns them."""
    got = op(x, eps, storage=storage)
    want = ref.quantize_affine_per_token_dynamic(x, eps)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_bit_equal(g, w, f"{name} eps={eps} output {i}")
    block = [1, 1, K_AFFINE]
    scales, zero_points = torch.ops.torchao.choose_qparams_affine(
        x, "ASYMMETRIC", block, torch.int8, -128, 127, eps, torch.float32, torch.float32)
    q = torch.ops.torchao.quantize_affine(x, block, scales, zero_points, torch.int8, -128, 127)
    assert_bit_equal(got[0], q, f"{name} eps={eps}: q against torchao")
    assert_bit_equal(got[1], scales, f"{name} eps={eps}: scales against torchao")
    assert_bit_equal(got[2].float(), zero_points, f"{name} eps={eps}: zero points against torchao")
    return got


# fp16 rows for the torchao comparison (torchao computes fp16 parameters in fp16): the fp32
# table's shapes that fp16 holds, constants and ranges within fp16, rows whose range overflows
# fp16 (torchao's scale is then infinite), subnormal values.
AFFINE_ROWS_HALF = {
    **{name: AFFINE_ROWS[name] for name in ("random", "quantize ties", "zero-point ties", "near ties", "zeros",
                                             "far from zero (zero point clamps)")},
    "constant": lambda gen, rows: torch.tensor([3.0, -3.0, 6e-8, -6e-8, 6e4, -6e4, 2.5, -0.0])[
        torch.randint(0, 8, (rows, 1), generator=gen)].expand(rows, K_AFFINE).clone(),
    "range overflows fp16 (infinite scale)": lambda gen, rows: (torch.rand(rows, K_AFFINE, generator=gen) - 0.5) * 1.2e5,
    "large one-sided": lambda gen, rows: torch.rand(rows, K_AFFINE, generator=gen) * 6.5e4,
    "subnormal (scale = eps)": lambda gen, rows: torch.randn(rows, K_AFFINE, generator=gen) * 2.0**-20,
}


@pytest.mark.parametrize("eps", [torch.finfo(torch.float32).eps, 2.0**-24, 2.0**-10])
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_fp16_affine_dynamic_quantize_bit_identical_to_torchao(storage, eps):
    """On fp16 input, whose parameters torchao computes in fp16 (then returns as fp32), against
    the reference and torchao's ops bit for bit."""
    pytest.importorskip("torchao", reason="the comparison needs torchao's ops")
    gen = torch.Generator().manual_seed(29)
    op = runtime.get_op("etvk.quantize_affine_per_token_dynamic.default")
    for name, rows in AFFINE_ROWS_HALF.items():
        x = rows(gen, 2048 if name == "random" else 256).reshape(2, -1, K_AFFINE).half()
        got = _check_affine_against_torchao(op, x, eps, storage, name)
        if name.startswith("range overflows"):
            assert bool(torch.isinf(got[1]).any()), "no row overflowed"


def test_per_token_parameters_in_other_dtypes_are_accepted():
    """int64 (PyTorch's choose_qparams) and whole-number float zero points, float64 scales."""
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(5, 12, generator=gen)
    scales, zps = per_token_params((5, 12), gen, "int8")
    quantize = runtime.get_op("etvk.quantize_per_token.default")
    want = quantize(x, scales, zps, -128, 127, torch.int8)
    for s, z in ((scales.double(), zps.long()), (scales, zps.float())):
        assert_bit_equal(quantize(x, s, z, -128, 127, torch.int8), want, f"{s.dtype} {z.dtype}")


def test_recorded_sequence_runs_without_host_round_trip():
    """choose_qparams → quantize_per_token → dequantize_per_token in one stream."""
    from runtime.vulkan.stream import Stream

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, 40, generator=gen)
    choose = runtime.get_op("etvk.choose_qparams_per_token_asymmetric.default")
    quantize = runtime.get_op("etvk.quantize_per_token.default")
    dequantize = runtime.get_op("etvk.dequantize_per_token.default")
    with Stream() as stream:
        scales, zps = choose.record(stream, x, torch.int8)
        q = quantize.record(stream, x, scales, zps, -128, 127, torch.int8)
        y = dequantize.record(stream, q, scales, zps, -128, 127, torch.int8, torch.float32)
        stream.run()
        got = y.to_torch()
    ref_scales, ref_zps = ref.choose_qparams_per_token_asymmetric(x, torch.int8)
    ref_q = ref.quantize_per_token(x, ref_scales, ref_zps, -128, 127, torch.int8)
    want = ref.dequantize_per_token(ref_q, ref_scales, ref_zps, -128, 127, torch.int8, torch.float32)
    assert_bit_equal(got, want, "sequence")


def test_registry_lists_every_op_with_its_variants():
    assert set(EXAMPLES) <= set(runtime.list_ops())
    counts = {name: len(runtime.get_op(name).variants) for name in QUANTIZE_OPS}
    assert counts == {
        "etvk.quantize_per_tensor.default": 12,
        "etvk.quantize_per_token.default": 12,
        "etvk.dequantize_per_tensor.default": 12,
        "etvk.dequantize_per_token.default": 12,
        "etvk.choose_qparams_per_token_asymmetric.default": 4,
        "etvk.quantize_per_token_dynamic.default": 4,
        "etvk.quantize_affine_per_token_dynamic.default": 4,
    }
    named = runtime.get_op("etvk.quantize_per_tensor.default").variants
    assert "quantize_per_tensor_texture3d_float_int8" in {v.name for v in named}


def test_torch_ops_cpu_kernel_is_the_reference_and_exports():
    x = torch.randn(4, 8)
    got = torch.ops.etvk.quantize_per_tensor.default(x, 0.05, 0, -128, 127, torch.int8)
    assert_bit_equal(got, ref.quantize_per_tensor(x, 0.05, 0, -128, 127, torch.int8), "cpu kernel")

    class Module(torch.nn.Module):
        def forward(self, x):
            scales, zps = torch.ops.etvk.choose_qparams_per_token_asymmetric.default(x, torch.int8)
            return torch.ops.etvk.quantize_per_token.default(x, scales, zps, -128, 127, torch.int8)

    program = torch.export.export(Module(), (torch.randn(3, 16),))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert "etvk.quantize_per_token.default" in targets
    assert "etvk.choose_qparams_per_token_asymmetric.default" in targets
    x = torch.randn(3, 16)
    out = program.module()(x)
    assert_bit_equal(out, Module()(x), "exported program")


# ---------------------------------------------------------------- bad inputs

X = torch.randn(2, 8)
Q = torch.zeros(2, 8, dtype=torch.int8)
S = torch.full((2, 1), 0.1)
Z = torch.zeros(2, 1, dtype=torch.int32)

BAD = [
    # (op, args, kwargs, exception, text the message must contain)
    ("quantize_per_tensor", (X, 0.0, 0, -128, 127, torch.int8), {}, ValueError, "argument 'scale': must be a finite number > 0"),
    ("quantize_per_tensor", (X, -1.0, 0, -128, 127, torch.int8), {}, ValueError, "argument 'scale'"),
    ("quantize_per_tensor", (X, math.nan, 0, -128, 127, torch.int8), {}, ValueError, "argument 'scale'"),
    ("quantize_per_tensor", (X, "0.1", 0, -128, 127, torch.int8), {}, TypeError, "argument 'scale': expected a float, got str"),
    ("quantize_per_tensor", (X.tolist(), 0.1, 0, -128, 127, torch.int8), {}, TypeError, "argument 'input': expected a tensor"),
    ("quantize_per_tensor", (X, 0.1, 0.5, -128, 127, torch.int8), {}, TypeError, "argument 'zero_point': expected an int"),
    ("quantize_per_tensor", (X, 0.1, 0, 10, -10, torch.int8), {}, ValueError, "argument 'quant_min': must be <= quant_max"),
    ("quantize_per_tensor", (X, 0.1, 0, -129, 127, torch.int8), {}, ValueError, "argument 'quant_min': -129 is below the range of torch.int8"),
    ("quantize_per_tensor", (X, 0.1, 0, 0, 256, torch.uint8), {}, ValueError, "argument 'quant_max': 256 is above the range of torch.uint8"),
    ("quantize_per_tensor", (X, 0.1, 0, -128, 127, torch.float32), {}, ValueError, "argument 'dtype': dtype torch.float32 is not supported"),
    ("quantize_per_tensor", (X.double(), 0.1, 0, -128, 127, torch.int8), {}, ValueError, "argument 'input': dtype torch.float64 is not supported; expected one of torch.float16, torch.float32"),
    ("quantize_per_tensor", (X, 0.1, 0, -128, 127, torch.int8), {"storage": "image"}, ValueError, "argument 'storage'"),
    ("quantize_per_tensor", (X, 0.1, 0, -128, 127, torch.int8), {"variant": "nope"}, ValueError, "argument 'variant': unknown variant 'nope'"),
    ("quantize_per_tensor", (X, 0.1, 0, -128, 127, torch.int8), {"variant": "quantize_per_tensor_buffer_half_int8"}, ValueError, "cannot serve these inputs: argument 'input' asks for IN_DTYPE=float32"),
    ("quantize_per_token", (X, S[:1], Z, -128, 127, torch.int8), {}, ValueError, "argument 'scales': must hold one value per token of input (2 tokens)"),
    ("quantize_per_token", (X, -S, Z, -128, 127, torch.int8), {}, ValueError, "argument 'scales': must all be finite and > 0"),
    ("quantize_per_token", (X, S, Z + 0.5, -128, 127, torch.int8), {}, ValueError, "argument 'zero_points': must hold whole numbers within int32"),
    ("quantize_per_token", (X, S, Z.long() + 2**31, -128, 127, torch.int8), {}, ValueError, "argument 'zero_points': must hold whole numbers within int32"),
    ("quantize_per_token", (X, S.double() * 1e-300, Z, -128, 127, torch.int8), {}, ValueError, "argument 'scales': must all be finite and > 0 as fp32 values"),
    ("quantize_per_token", (X, Z, Z, -128, 127, torch.int8), {}, ValueError, "argument 'scales': must be a floating-point tensor"),
    ("dequantize_per_tensor", (Q, 0.1, 0, -128, 127, torch.uint8), {}, ValueError, "argument 'input': has dtype torch.int8 but the dtype argument says torch.uint8"),
    ("dequantize_per_tensor", (Q, 0.1, 0, -128, 127, torch.int8), {"out_dtype": torch.float64}, ValueError, "argument 'out_dtype': dtype torch.float64 is not supported"),
    ("dequantize_per_token", (Q, S, Z[:1], -128, 127, torch.int8, torch.float32), {}, ValueError, "argument 'zero_points': must hold one value per token"),
    ("choose_qparams_per_token_asymmetric", (X, torch.uint8), {}, ValueError, "argument 'dtype': must be torch.int8"),
    ("choose_qparams_per_token_asymmetric", (torch.tensor(1.0), torch.int8), {}, ValueError, "argument 'input': must have at least one dimension"),
    ("choose_qparams_per_token_asymmetric", (torch.zeros(3, 0), torch.int8), {}, ValueError, "argument 'input': has an empty last dimension"),
    ("quantize_per_token_dynamic", (torch.zeros(2, 6), torch.int8), {}, ValueError, "argument 'input': has a last dimension of 6, not a multiple of 4"),
    ("quantize_per_token_dynamic", (torch.zeros(2, 8), torch.uint8), {}, ValueError, "argument 'dtype': must be torch.int8"),
    ("quantize_affine_per_token_dynamic", (X.double(), 1e-7), {}, ValueError, "argument 'input': must be float32 or float16, got torch.float64"),
    ("quantize_affine_per_token_dynamic", (X.half(), 0.01), {}, ValueError, "argument 'eps': must be an fp16 value for float16 input (the scales are computed in fp16), got 0.01"),
    ("quantize_affine_per_token_dynamic", (torch.zeros(2, 6), 1e-7), {}, ValueError, "argument 'input': has a last dimension of 6, not a multiple of 4"),
    ("quantize_affine_per_token_dynamic", (X, 0.0), {}, ValueError, "argument 'eps': must be a finite fp32 value >= 2**-64, got 0.0"),
    ("quantize_affine_per_token_dynamic", (X, 1e39), {}, ValueError, "argument 'eps': must be a finite fp32 value >= 2**-64"),
    ("quantize_affine_per_token_dynamic", (X, "1e-7"), {}, TypeError, "argument 'eps': expected a float, got str"),
]


@pytest.mark.parametrize(("op_name", "args", "kwargs", "error", "text"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_arguments_are_rejected_clearly(op_name, args, kwargs, error, text):
    name = f"etvk.{op_name}.default"
    with pytest.raises(error) as info:
        runtime.get_op(name)(*args, **kwargs)
    assert isinstance(info.value, runtime.EtvkError)
    message = str(info.value)
    assert message.startswith(name + ": "), message
    assert text in message, message


def _device_limits():
    return get_device().caps


def test_tensor_beyond_buffer_limit_is_rejected_with_op_and_argument():
    limit = _device_limits().limits.max_storage_buffer_range
    # A stride-0 view: the size check runs on the shape, before any memory is touched.
    x = torch.zeros(1).expand(limit // (4 << 20) + 1, 1024, 1024)
    with pytest.raises(runtime.TensorTooLarge) as info:
        runtime.get_op("etvk.quantize_per_tensor.default")(x, 0.1, 0, -128, 127, torch.int8)
    message = str(info.value)
    assert message.startswith("etvk.quantize_per_tensor.default: argument 'input'"), message
    assert "over the device limit" in message, message


def test_tensor_beyond_image_limit_is_rejected_with_op_and_argument():
    limit = _device_limits().limits.max_image_dimension_3d
    x = torch.zeros(1, dtype=torch.float16).expand(2, 4 * limit + 4)
    with pytest.raises(runtime.TensorTooLarge) as info:
        runtime.get_op("etvk.quantize_per_tensor.default")(
            x, 0.1, 0, -128, 127, torch.int8, storage="texture3d"
        )
    assert str(info.value).startswith("etvk.quantize_per_tensor.default: argument 'input'")


def test_dispatch_trace_records_op_variant_and_sizes(dispatch_trace_path):
    op = runtime.get_op("etvk.quantize_per_tensor.default")
    op(torch.randn(3, 10), 0.1, 0, -128, 127, torch.int8, storage="buffer")
    line = json.loads(dispatch_trace_path.read_text().splitlines()[-1])
    assert line["op"] == "etvk.quantize_per_tensor.default"
    assert line["variant"] == "quantize_per_tensor_buffer_float_int8"
    workgroup = list(catalog().variant(line["variant"]).interface.workgroup)
    assert line["global"] == [4, 1, 1]  # 30 values in units of 4, 2 units per invocation
    assert line["local"] == workgroup
    assert line["groups"] == [-(-4 // workgroup[0]), 1, 1]
    assert line["device"] == get_device().caps.name
