"""linear_qta8a_qga4w (OPS.md family 3): every generated variant against the
fp64 oracle (tight tolerance) and the fp32 reference (bit-identical: the
shaders take the reference's fp32 steps in its order, unfused), the
bad-argument errors, the dynamic-activation sequence recorded in one stream,
and weight prepacking, on the default Vulkan device with the validation
layer on (tests/conftest.py).

Cases are tables: `CASES` are (leading shape, K, N, group size); gemv
variants serve one token, gemm variants more, so each variant runs the cases
its kernel serves.
"""

from __future__ import annotations

import itertools
import math
import zlib

import pytest
import torch

import runtime
import runtime.families.linear_weights as linear_weights
from runtime.families.int4 import pack_int4, unpack_int4
from runtime.families.linear_tiling import few_round_fits, few_tiling
from runtime.ops import matrix_layouts
from runtime.ops.library import catalog
from runtime.reference import linear as ref
from runtime.reference import quantize as qref
from runtime.tools.examples import linear_args
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream

OP = "etvk.linear_qta8a_qga4w.default"  # the dispatcher: routes to one of the two below
TILED = "etvk.linear_qta8a_qga4w_tiled.default"  # gemv and gemm kernels
COOP = "etvk.linear_qta8a_qga4w_coop.default"  # cooperative matrices (group sizes % 32 == 0)
FEW = "etvk.linear_qta8a_qga4w_coop_few.default"  # few tokens on them (group sizes % 64 == 0)

# (leading shape of x, K, N, group size). Tokens 1, 2, 3, 17 and 3-D inputs;
# N not a multiple of 4; one group, many groups, more groups than a gemv
# round (K / 8 = 512 groups); at most ~10 MFLOP each to keep lavapipe fast.
CASES = [
    ((), 64, 8, 32),  # 1-D x
    ((1,), 64, 7, 64),  # one group
    ((1, 1), 256, 13, 64),
    ((1, 1), 128, 5, 8),
    ((1,), 4096, 40, 128),
    ((1,), 4096, 12, 8),
    ((1,), 4096, 33, 32),
    ((2,), 64, 9, 32),
    ((3,), 256, 12, 128),
    ((17,), 256, 37, 64),
    ((17,), 4096, 16, 32),
    ((2, 3), 64, 5, 8),
    ((2, 17), 256, 21, 32),
    ((3, 1), 128, 4, 128),
    ((1, 17), 4096, 6, 64),
    # Texel rows in pairs with an odd pair count (group 48), and single rows (group 24).
    ((1,), 144, 9, 48),
    ((5,), 96, 11, 48),
    ((1,), 72, 6, 24),
    ((6,), 120, 7, 24),
    # Several tiles of the cooperative-matrix kernel (32 tokens x 64 rows), K not a
    # whole number of its 128-value stages, a group spanning two stages.
    ((33,), 96, 65, 32),
    ((40,), 512, 130, 128),
    ((2, 35), 512, 70, 256),
]
# Calls of at least FEW_SPLIT2_MIN_TILES tiles of 16 rows x 8 tokens, which the few-token
# kernel's rule gives its SPLIT-2 variant (GPU only: only the few-token variants take them).
FEW_SPLIT2_CASES = [
    ((16,), 128, 5120, 64),
    ((8,), 256, 10240, 128),
    ((2, 12), 192, 5130, 64),  # a partial row tile
    ((32,), 256, 3000, 256),
    ((11,), 64, 8200, 64),  # a partial token tile
]

# The fp64 oracle: relative to the largest output magnitude of the case.
RTOL = 1e-5


def _variants():
    return [
        pytest.param(leaf, info.name, id=info.name)
        for leaf in (TILED, COOP, FEW)
        for info in runtime.get_op(leaf).variants
    ]


def _cases(variant) -> list:
    return CASES + (FEW_SPLIT2_CASES if variant.startswith("linear_qta8a_qga4w_coop_few") else [])


def _serves(variant, axes, lead, n, group_size) -> bool:
    if variant.startswith("linear_qta8a_qga4w_coop_few"):  # K blocks of 64, the rule's SPLIT
        return group_size % 64 == 0 and few_tiling(n, math.prod(lead), group_size).axis == axes["SPLIT"]
    if "KERNEL" not in axes:  # the cooperative-matrix kernel: any tokens, K steps of 32
        return group_size % 32 == 0
    return (axes["KERNEL"] == "gemv") == (math.prod(lead) == 1)


def _skip_unless_runnable(variant):
    info = catalog().variant(variant)
    ok, reason = info.runnable(get_device().caps)
    if not ok:
        pytest.skip(f"{variant}: {reason}")
    if info.axes.get("SUMS") == "registers" and not matrix_layouts.has_mma_16x8_accumulator():
        pytest.skip(f"{variant}: the device's 16x8 int32 accumulator is not laid out as MMA_16X8")


def assert_close_to_oracle(got, args, what):
    want = ref.linear_qta8a_qga4w_fp64(*args)
    assert got.dtype == torch.float32 and got.shape == want.shape, f"{what}: {got.dtype} {got.shape}"
    scale = want.abs().max().item() if want.numel() else 0.0
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    assert err <= RTOL * scale, f"{what}: max error {err:.3g} > {RTOL:g} * {scale:.3g}"


def assert_bit_equal(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.shape} vs {want.shape}"
    differ = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
    assert differ == 0, f"{what}: {differ} of {got.numel()} values differ from the fp32 reference"


@pytest.mark.parametrize(("leaf", "variant"), _variants())
def test_variant_matches_references(leaf, variant, dispatch_trace):
    _skip_unless_runnable(variant)
    op = runtime.get_op(leaf)
    axes = catalog().variant(variant).axes
    gen = torch.Generator().manual_seed(zlib.crc32(variant.encode()))
    ran = 0
    for lead, k, n, gs in _cases(variant):
        if not _serves(variant, axes, lead, n, gs):
            continue
        args, _ = linear_args(lead, k, n, gs, gen)
        got = op(*args, variant=variant)
        what = f"{variant} x={(*lead, k)} N={n} group_size={gs}"
        assert_close_to_oracle(got, args, what)
        assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), what)
        ran += 1
    assert ran >= 5
    assert variant in dispatch_trace(), f"{variant} never reached the device"


def test_op_picks_gemv_for_one_token_and_gemm_for_more(dispatch_trace_path):
    op = runtime.get_op(OP)
    gen = torch.Generator().manual_seed(1)
    for lead, kernel in (((1,), "gemv"), ((1, 1), "gemv"), ((2,), "gemm"), ((3, 5), "gemm")):
        for storage in ("buffer", "texture3d"):
            args, _ = linear_args(lead, 64, 6, 32, gen)
            before = dispatch_trace_path.read_text().count("\n") if dispatch_trace_path.exists() else 0
            got = op(*args, storage=storage)
            assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), f"{lead} {storage}")
            line = dispatch_trace_path.read_text().splitlines()[before]
            assert f"linear_qta8a_qga4w_{kernel}_" in line and f"_{storage}_" in line, line


def test_op_picks_coop_for_many_tokens_where_the_device_has_it(dispatch_trace_path):
    """From LINEAR_COOP_MIN_WORK tokens x output rows with group sizes % 32 == 0 the
    dispatcher hands the call to the cooperative-matrix kernel where it runs, else to the
    tiled gemm."""
    from runtime.ops.stub_support import LINEAR_COOP_MIN_WORK

    coop = catalog().variant("linear_qta8a_qga4w_coop_buffer").runnable(get_device().caps)[0]
    gen = torch.Generator().manual_seed(12)
    n = 2048
    enough = -(-LINEAR_COOP_MIN_WORK // n)
    for tokens, gs, kernel in ((enough, 32, "coop" if coop else "gemm"), (enough - 1, 32, "gemm"),
                               (enough, 16, "gemm")):
        args, _ = linear_args((tokens,), 32, n, gs, gen)
        before = dispatch_trace_path.read_text().count("\n") if dispatch_trace_path.exists() else 0
        got = runtime.get_op(OP)(*args)
        assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), f"{tokens} tokens group_size={gs}")
        line = dispatch_trace_path.read_text().splitlines()[before]
        assert f"linear_qta8a_qga4w_{kernel}_" in line, line


def test_op_picks_the_few_token_kernel_where_the_device_has_it(dispatch_trace_path):
    """From 2 tokens on, with no upper bound, group sizes % 64 == 0 and activations in a
    buffer go to the few-token cooperative-matrix kernel where it runs (reading its sums from
    registers where the probe found the layout it assumes); one token, other group sizes and
    image activations do not."""
    from runtime.ops.stub_support import LINEAR_FEW_MIN_TOKENS, LINEAR_FEW_VARIANT

    few = catalog().variant(LINEAR_FEW_VARIANT).runnable(get_device().caps)[0]
    sums = "registers" if matrix_layouts.has_mma_16x8_accumulator() else "shared"
    gen = torch.Generator().manual_seed(15)
    rows = (
        (LINEAR_FEW_MIN_TOKENS, 64, "buffer", f"coop_few_s4_{sums}" if few else "gemm"),
        (33, 128, "buffer", f"coop_few_s4_{sums}" if few else "gemm"),
        (130, 64, "buffer", f"coop_few_s4_{sums}" if few else "gemm"),
        (1, 64, "buffer", "gemv"),
        (8, 32, "buffer", "gemm"),
        (8, 64, "texture3d", "gemm"),
    )
    for tokens, gs, storage, kernel in rows:
        args, _ = linear_args((tokens,), 128, 24, gs, gen)
        before = dispatch_trace_path.read_text().count("\n") if dispatch_trace_path.exists() else 0
        got = runtime.get_op(OP)(*args, storage=storage)
        assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), f"{tokens} tokens group_size={gs} {storage}")
        line = dispatch_trace_path.read_text().splitlines()[before]
        assert f"linear_qta8a_qga4w_{kernel}" in line, line


def test_few_rejects_group_sizes_it_cannot_block():
    args, _ = linear_args((4,), 64, 4, 32, torch.Generator().manual_seed(16))
    with pytest.raises(runtime.ArgumentError, match="argument 'group_size': must be a multiple of 64"):
        runtime.get_op(FEW)(*args)


def test_coop_rejects_group_sizes_it_cannot_step():
    args, _ = linear_args((20,), 64, 4, 16, torch.Generator().manual_seed(13))
    with pytest.raises(runtime.ArgumentError, match="argument 'group_size': must be a multiple of 32"):
        runtime.get_op(COOP)(*args)


def test_forced_variant_of_the_other_kernel_is_rejected():
    op = runtime.get_op(OP)
    args, _ = linear_args((3,), 64, 4, 32, torch.Generator().manual_seed(2))
    with pytest.raises(runtime.UnsupportedVariant, match="argument 'x' asks for KERNEL=gemm"):
        op(*args, variant="linear_qta8a_qga4w_gemv_fallback_buffer_buffer")
    args, _ = linear_args((1,), 64, 4, 32, torch.Generator().manual_seed(2))
    with pytest.raises(runtime.UnsupportedVariant, match="argument 'x' asks for KERNEL=gemv"):
        op(*args, variant="linear_qta8a_qga4w_gemm_fallback_buffer_buffer")


def test_zero_tokens_and_flat_parameters():
    op = runtime.get_op(OP)
    gen = torch.Generator().manual_seed(3)
    args, _ = linear_args((0, 3), 64, 5, 32, gen)
    assert op(*args).shape == (0, 3, 5)
    x, s, z, w, gs, ws, wz = linear_args((4, 3), 64, 5, 32, gen)[0]
    flat = (x, s.reshape(12), z.reshape(12), w, gs, ws, wz)
    assert_bit_equal(op(*flat), ref.linear_qta8a_qga4w(*flat), "[tokens] scales and zero points")


@pytest.mark.parametrize("dot", ["sdot", "fallback"])
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize(("kernel", "lead"), [("gemv", (1,)), ("gemm", (5,))])
def test_every_work_split_gives_the_same_bits(kernel, lead, storage, dot):
    """The host picks C invocations per tile and GL groups per round; the shader's
    contract allows any powers of two GL <= C <= 64, and all give the same bits, with
    rounds of fewer groups than GL, and outputs in buffers or in images (where a token's 4
    rows share a texel). Both DOT values: only sdot loads its weights in batches."""
    from runtime.vulkan.tensor import Tensor

    name = f"linear_qta8a_qga4w_{kernel}_{dot}_{storage}_buffer"
    _skip_unless_runnable(name)
    variant = catalog().variant(name)
    k, n, gs = 320, 10, 32  # 10 groups of 4 weight texels per row block
    x, s, z, w, _, ws, wz = linear_args(lead, k, n, gs, torch.Generator().manual_seed(10))[0]
    want = ref.linear_qta8a_qga4w(x, s, z, w, gs, ws, wz).reshape(-1, n)
    tokens = want.shape[0]
    packed = linear_weights.pack_linear_weights(w, ws, wz, gs)
    blocks = -(-n // 4)
    splits = [(c, 2**e) for c in (1, 2, 4, 8, 16, 32, 64) for e in range(c.bit_length())]
    for c, gl in splits:
        with Stream() as stream:
            out = Tensor.empty((tokens, n), torch.float32, storage)
            bindings = {
                "t_out": out,
                "t_x": Tensor.from_torch(x.reshape(tokens, k), storage),
                "t_w": Tensor.from_torch(packed),
                "t_input_scale": Tensor.from_torch(s.reshape(-1)),
                "t_input_zero_point": Tensor.from_torch(z.reshape(-1)),
            }
            groups = [-(-blocks // (64 // c)), 1 if kernel == "gemv" else -(-tokens // 4), 1]
            stream.dispatch(variant, OP, bindings=bindings, push={"sizes": [k, n, tokens, gs],
                            "coop": [c, gl, 0, 0]}, groups=groups)
            stream.run()
            assert_bit_equal(out.to_torch(), want, f"{variant.name} C={c} GL={gl}")


@pytest.mark.parametrize(("gs", "k"), [(32, 512), (32, 480), (256, 512)])
def test_every_coop_staging_gives_the_same_bits(gs, k):
    """The cooperative-matrix kernel stages STEPS K steps of 32 at a time (a spec constant,
    at most 8 within 48 KB of shared memory), at group size 32 with each step's sums in their
    own accumulators or not (STEP_SUMS); every pair gives the reference's bits, groups shorter
    and longer than a stage alike, and a partial last stage (K 480: 15 steps)."""
    from runtime.vulkan.tensor import Tensor

    _skip_unless_runnable("linear_qta8a_qga4w_coop_buffer")
    variant = catalog().variant("linear_qta8a_qga4w_coop_buffer")
    n, tokens = 70, 40
    x, s, z, w, _, ws, wz = linear_args((tokens,), k, n, gs, torch.Generator().manual_seed(15))[0]
    want = ref.linear_qta8a_qga4w(x, s, z, w, gs, ws, wz)
    for steps, step_sums in itertools.product((2, 4, 8), (0, 1)):
        with Stream() as stream:
            out = Tensor.empty((tokens, n), torch.float32, "buffer")
            bindings = {
                "t_out": out,
                "t_x": Tensor.from_torch(x),
                "t_w": Tensor.from_torch(linear_weights.pack_linear_weights_coop(w)),
                "t_meta": Tensor.from_torch(linear_weights.pack_linear_meta_coop(w, ws, wz, gs)),
                "t_input_scale": Tensor.from_torch(s.reshape(-1)),
                "t_input_zero_point": Tensor.from_torch(z.reshape(-1)),
            }
            stream.dispatch(variant, COOP, bindings=bindings, push={"sizes": [k, n, tokens, gs]},
                            spec_constants={"STEPS": steps, "STEP_SUMS": step_sums},
                            groups=[-(-n // 64), -(-tokens // 32), 1])
            stream.run()
            assert_bit_equal(out.to_torch(), want, f"STEPS={steps} STEP_SUMS={step_sums} group_size={gs} K={k}")


@pytest.mark.parametrize("gs", [64, 128, 192, 256])
@pytest.mark.parametrize("sums", ["registers", "shared"])
def test_every_few_tiling_gives_the_same_bits(sums, gs):
    """The few-token kernel's tile of 16 rows x 8 tokens goes to the 4 or 2 subgroups of its
    workgroup (the variant's SPLIT) in rounds of ROUND groups each; every pair whose rounds
    hold whole lookaheads gives the reference's bits, with either way of reading the sums
    (SUMS): 3 row tiles (the last partly past N), 11 tokens (a partial token tile), K of
    several rounds with a partial last one, group sizes of 1 to 4 blocks of 64."""
    from runtime.vulkan.tensor import Tensor

    _skip_unless_runnable(f"linear_qta8a_qga4w_coop_few_s4_{sums}")
    k, n, tokens = 1536, 40, 11
    x, s, z, w, _, ws, wz = linear_args((tokens,), k, n, gs, torch.Generator().manual_seed(16))[0]
    want = ref.linear_qta8a_qga4w(x, s, z, w, gs, ws, wz)
    bindings = {
        "t_x": Tensor.from_torch(x),
        "t_w": Tensor.from_torch(linear_weights.pack_linear_weights_few(w)),
        "t_meta": Tensor.from_torch(linear_weights.pack_linear_meta_few(w, ws, wz, gs)),
        "t_input_scale": Tensor.from_torch(s.reshape(-1)),
        "t_input_zero_point": Tensor.from_torch(z.reshape(-1)),
    }
    ran = 0
    for split in (2, 4):
        for round_ in (2, 4, 8):
            if not few_round_fits(round_, gs):
                continue
            tiling = few_tiling(n, tokens, gs, split, round_)
            variant = catalog().variant(f"linear_qta8a_qga4w_coop_few_{tiling.axis}_{sums}")
            with Stream() as stream:
                out = Tensor.empty((tokens, n), torch.float32, "buffer")
                stream.dispatch(variant, FEW, bindings={**bindings, "t_out": out},
                                push={"sizes": [k, n, tokens, gs]},
                                spec_constants={"BLOCKS_PER_GROUP": gs // 64, "ROUND": round_},
                                groups=tiling.groups)
                stream.run()
                assert_bit_equal(out.to_torch(), want, f"{variant.name} ROUND={round_} group_size={gs}")
            ran += 1
    assert ran >= 4


# ---------------------------------------------------------------- dynamic activations in one stream


@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
@pytest.mark.parametrize("lead", [(1,), (2, 5)], ids=["gemv", "gemm"])
def test_dynamic_activation_sequence_in_one_stream(storage, lead, monkeypatch, dispatch_trace_path):
    """choose_qparams -> quantize_per_token -> linear recorded in one stream; nothing
    is read back to the host until the stream has run."""
    from runtime.vulkan.tensor import Tensor

    gen = torch.Generator().manual_seed(4)
    k, n, gs = 256, 11, 64
    x = torch.randn(*lead, k, generator=gen) * 3
    _, _, _, weight, _, weight_scales, weight_zeros = linear_args(lead, k, n, gs, gen)[0]
    choose = runtime.get_op("etvk.choose_qparams_per_token_asymmetric.default")
    quantize = runtime.get_op("etvk.quantize_per_token.default")
    linear = runtime.get_op(OP)

    def no_read_back(self):
        raise AssertionError("a device tensor was read back while recording")

    before = dispatch_trace_path.read_text().count("\n") if dispatch_trace_path.exists() else 0
    with Stream() as stream:
        with monkeypatch.context() as m:
            m.setattr(Tensor, "to_torch", no_read_back)
            scales, zps = choose.record(stream, x, torch.int8, storage=storage)
            q = quantize.record(stream, x, scales, zps, -128, 127, torch.int8, storage=storage)
            y = linear.record(stream, q, scales, zps, weight, gs, weight_scales, weight_zeros,
                              storage=storage)
            stream.run()
        got = y.to_torch()
    trace = dispatch_trace_path.read_text().splitlines()[before:]
    assert len(trace) == 3, trace

    ref_scales, ref_zps = qref.choose_qparams_per_token_asymmetric(x, torch.int8)
    ref_q = qref.quantize_per_token(x, ref_scales, ref_zps, -128, 127, torch.int8)
    args = (ref_q, ref_scales, ref_zps, weight, gs, weight_scales, weight_zeros)
    assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), "sequence")
    assert_close_to_oracle(got, args, "sequence")


# ---------------------------------------------------------------- prepacking


def test_weights_are_packed_and_uploaded_once(monkeypatch):
    import runtime.vulkan.tensor

    calls = []
    pack = linear_weights.pack_linear_weights

    def counting(*args):
        calls.append(args)
        return pack(*args)

    monkeypatch.setattr(linear_weights, "pack_linear_weights", counting)
    uploads = []
    from_torch = runtime.vulkan.tensor.Tensor.from_torch.__func__

    def counting_upload(cls, value, *args, **kwargs):
        uploads.append((tuple(value.shape), value.dtype))
        return from_torch(cls, value, *args, **kwargs)

    monkeypatch.setattr(runtime.vulkan.tensor.Tensor, "from_torch", classmethod(counting_upload))

    op = runtime.get_op(OP)
    gen = torch.Generator().manual_seed(6)
    args, _ = linear_args((3,), 128, 10, 32, gen)
    _, _, _, weight, gs, ws, wz = args
    packed_shape = (3, 4 * linear_weights.packed_row_texels(128, gs))
    one, _ = linear_args((1,), 128, 10, 32, gen)
    one = one[:3] + args[3:]
    for call in (args, args, one, one):  # gemm twice, gemv twice, the same weights
        got = op(*call)
        assert_bit_equal(got, ref.linear_qta8a_qga4w(*call), "prepacked")
    assert len(calls) == 1, f"packed {len(calls)} times"
    assert uploads.count((packed_shape, torch.int32)) == 1, uploads

    # An in-place change to the weight repacks it (the cache keys on the tensor version).
    weight.copy_(pack_int4(-unpack_int4(weight).clamp(-7, 7)))
    got = op(*args)
    assert len(calls) == 2
    assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), "after an in-place change")


def _random_weights(n: int, k: int, group_size: int, seed: int):
    """Unpacked int8 weights in [-8, 7] [n, k], fp32 scales and int32 zeros [n, k / group_size]."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8)
    ws = torch.randn(n, k // group_size, generator=gen)
    wz = torch.randint(-8, 8, (n, k // group_size), generator=gen, dtype=torch.int32)
    return w, ws, wz


def test_packed_layout_matches_its_description():
    """Texel t = j*G + g of block b, component r: 8 nibbles of row 4b+r (byte i: low
    nibble k+i, high nibble k+4+i), then the scale bits, then (c << 4) | zq."""
    n, k, gs = 6, 64, 16
    w, ws, wz = _random_weights(n, k, gs, seed=7)
    packed = linear_weights.pack_linear_weights(pack_int4(w), ws, wz, gs)
    groups, j_count = k // gs, gs // 8
    row_texels = linear_weights.packed_row_texels(k, gs)
    assert packed.shape == (2, 4 * row_texels) and packed.dtype == torch.int32
    texels = packed.reshape(2, row_texels, 4)
    for row in range(n):
        b, r = divmod(row, 4)
        for g in range(groups):
            for j in range(j_count):
                word = int(texels[b, j * groups + g, r]) & 0xFFFFFFFF
                k0 = g * gs + 8 * j
                for i in range(4):
                    byte = (word >> (8 * i)) & 0xFF
                    assert byte & 0xF == int(w[row, k0 + i]) + 8
                    assert byte >> 4 == int(w[row, k0 + 4 + i]) + 8
            scale = texels[b, j_count * groups + g, r].reshape(1).view(torch.float32)
            assert scale.item() == ws[row, g].item()
            corr = int(texels[b, (j_count + 1) * groups + g, r])
            assert corr & 0xF == int(wz[row, g]) + 8
            assert corr >> 4 == int((w[row, g * gs:(g + 1) * gs].int() - wz[row, g]).sum())
    # Rows 6 and 7 pad block 1: w = 0 (nibbles 8), scale 0, zq = 8, c = 0.
    padding = texels[1, :, 2:]
    assert (padding[: j_count * groups] == 0x88888888 - 2**32).all()
    assert (padding[j_count * groups : (j_count + 1) * groups] == 0).all()
    assert (padding[(j_count + 1) * groups :] == 8).all()
    back = linear_weights.unpack_linear_weights(packed, n, k, gs)
    for got, want in zip(back, (pack_int4(w), ws, wz), strict=True):
        assert torch.equal(got, want)


def test_coop_packed_layout_matches_its_description():
    """Row n: unit s (16 bytes) holds k = 32s .. 32s+31, word i byte b: low nibble k+8i+b,
    high nibble k+8i+4+b; metadata planes [scale bits, (c << 4) | zq] x [G, N_pad]."""
    n, k, gs = 70, 96, 32
    w, ws, wz = _random_weights(n, k, gs, seed=14)
    packed = linear_weights.pack_linear_weights_coop(pack_int4(w))
    meta = linear_weights.pack_linear_meta_coop(pack_int4(w), ws, wz, gs)
    assert packed.shape == (128, k // 8) and packed.dtype == torch.int32
    assert meta.shape == (2, k // gs, 128) and meta.dtype == torch.int32
    words = packed.to(torch.int64) & 0xFFFFFFFF
    nibbles = torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=-1)  # [rows, word, nibble]
    q = torch.cat((nibbles[:, :, 0::2], nibbles[:, :, 1::2]), dim=-1).reshape(128, k)
    assert torch.equal(q[:n], w.to(torch.int64) + 8)
    assert (q[n:] == 8).all()
    assert torch.equal(meta[0, :, :n].contiguous().view(torch.float32), ws.t())
    assert torch.equal(meta[1, :, :n] & 0xF, wz.t() + 8)
    c = (w.int() - wz.repeat_interleave(gs, dim=1)).reshape(n, k // gs, gs).sum(dim=-1)
    assert torch.equal(meta[1, :, :n] >> 4, c.t())
    assert (meta[0, :, n:] == 0).all() and (meta[1, :, n:] == 8).all()


def test_few_packed_layout_matches_its_description():
    """Unit (tile * K/64 + b) * 32 + 4 g + t, word 2 s + h: row 16 tile + g + 8 h, byte i:
    low nibble k + i, high k + 32 + i, k = 64 b + 16 (t >> 1) + 8 s + 4 (t & 1); metadata unit
    (tile * G + group) * 8 + g: scale bits of rows g and g + 8, then their (c << 4) | zq."""
    n, k, gs = 40, 256, 128
    w, ws, wz = _random_weights(n, k, gs, seed=17)
    packed = linear_weights.pack_linear_weights_few(pack_int4(w))
    meta = linear_weights.pack_linear_meta_few(pack_int4(w), ws, wz, gs)
    tiles, blocks, groups = 3, k // 64, k // gs
    assert packed.shape == (tiles * blocks * 32, 4) and packed.dtype == torch.int32
    assert meta.shape == (tiles * groups * 8, 4) and meta.dtype == torch.int32
    q = torch.full((16 * tiles, k), -1, dtype=torch.int64)
    words = packed.to(torch.int64) & 0xFFFFFFFF
    for unit in range(packed.shape[0]):
        tile, b, lane = unit // (blocks * 32), unit // 32 % blocks, unit % 32
        g, t = lane // 4, lane % 4
        for s in range(2):
            for h in range(2):
                word = int(words[unit, 2 * s + h])
                k0 = 64 * b + 16 * (t >> 1) + 8 * s + 4 * (t & 1)
                for i in range(4):
                    q[16 * tile + g + 8 * h, k0 + i] = (word >> (8 * i)) & 0xF
                    q[16 * tile + g + 8 * h, k0 + 32 + i] = (word >> (8 * i + 4)) & 0xF
    assert torch.equal(q[:n], w.to(torch.int64) + 8)
    assert (q[n:] == 8).all()
    c = (w.int() - wz.repeat_interleave(gs, dim=1)).reshape(n, groups, gs).sum(dim=-1)
    for unit in range(meta.shape[0]):
        tile, group, g = unit // (groups * 8), unit // 8 % groups, unit % 8
        for h in range(2):
            row = 16 * tile + g + 8 * h
            scale = meta[unit, h : h + 1].view(torch.float32).item()
            czq = int(meta[unit, 2 + h])
            if row < n:
                assert scale == ws[row, group].item() and czq & 0xF == wz[row, group] + 8
                assert czq >> 4 == c[row, group]
            else:
                assert (scale, czq) == (0.0, 8)


# ---------------------------------------------------------------- bad inputs

_GOOD, _ = linear_args((2, 3), 64, 6, 32, torch.Generator().manual_seed(8))
X, S, Z, W, GS, WS, WZ = _GOOD


def _with(**changes):
    names = ("x", "input_scale", "input_zero_point", "weight", "group_size", "weight_scales", "weight_zeros")
    values = dict(zip(names, _GOOD, strict=True))
    values.update(changes)
    return tuple(values[n] for n in names)


BAD = [
    # (arguments, exception, text the message must contain)
    (_with(x=X.float()), ValueError, "argument 'x': must be int8"),
    (_with(x=torch.zeros((), dtype=torch.int8)), ValueError, "argument 'x': must have shape [..., K]"),
    (_with(x=X[..., :63]), ValueError, "argument 'x': has an odd last dimension K=63"),
    (_with(weight=W.to(torch.int8)), ValueError, "argument 'weight': must be packed 4-bit weights of dtype torch.uint8"),
    (_with(weight=W[:, :16]), ValueError, "argument 'weight': must have shape [N, K/2] = [N, 32]"),
    (_with(weight=W.reshape(-1)), ValueError, "argument 'weight': must have shape [N, K/2]"),
    (_with(x=X[..., :48], weight=W[:, :24]), ValueError, "argument 'group_size': must divide K=48, got 32"),
    (_with(group_size=12), ValueError, "argument 'group_size': must be a positive multiple of 8, got 12"),
    (_with(group_size=0), ValueError, "argument 'group_size': must be a positive multiple of 8, got 0"),
    (_with(group_size=32.0), TypeError, "argument 'group_size': expected an int"),
    (_with(weight_scales=WS[:, :1]), ValueError, "argument 'weight_scales': must have shape [N, K/group_size] = [6, 2], got (6, 1)"),
    (_with(weight_scales=WS.double()), ValueError, "argument 'weight_scales': must be torch.float32"),
    (_with(weight_zeros=WZ[:5]), ValueError, "argument 'weight_zeros': must have shape [N, K/group_size] = [6, 2], got (5, 2)"),
    (_with(weight_zeros=WZ.long()), ValueError, "argument 'weight_zeros': must be torch.int32"),
    (_with(weight_zeros=WZ + 8), ValueError, "argument 'weight_zeros': values must lie in [-8, 7]"),
    (_with(input_scale=S[:1]), ValueError, "argument 'input_scale': must hold one value per token of x (6 tokens)"),
    (_with(input_scale=S.reshape(2, 3)), ValueError, "argument 'input_scale': must hold one value per token"),
    (_with(input_scale=S.double()), ValueError, "argument 'input_scale': must be torch.float32"),
    (_with(input_zero_point=Z[:, :2]), ValueError, "argument 'input_zero_point': must hold one value per token of x (6 tokens)"),
    (_with(input_zero_point=Z.float()), ValueError, "argument 'input_zero_point': must be torch.int32"),
    (_with(input_scale=[0.1] * 6), TypeError, "argument 'input_scale': expected a tensor"),
]


@pytest.mark.parametrize(("args", "error", "text"), BAD, ids=[f"bad-{i}" for i in range(len(BAD))])
def test_bad_arguments_are_rejected_clearly(args, error, text):
    with pytest.raises(error) as info:
        runtime.get_op(OP)(*args)
    assert isinstance(info.value, runtime.EtvkError)
    message = str(info.value)
    assert message.startswith(OP + ": "), message
    assert text in message, message


def test_bad_storage_and_variant_are_rejected():
    op = runtime.get_op(OP)
    with pytest.raises(ValueError, match="argument 'storage'"):
        op(*_GOOD, storage="image")
    with pytest.raises(ValueError, match="argument 'variant': unknown variant 'nope'"):
        op(*_GOOD, variant="nope")


def test_weights_beyond_the_image_limit_are_rejected_with_op_and_name():
    """texture2d weights: one image row per block of 4 output rows."""
    limit = get_device().caps.limits.max_image_dimension_2d
    args, _ = linear_args((1,), 64, 4 * (limit + 1), 32, torch.Generator().manual_seed(11))
    with pytest.raises(runtime.TensorTooLarge) as info:
        runtime.get_op(OP)(*args, variant="linear_qta8a_qga4w_gemv_fallback_buffer_texture2d")
    assert str(info.value).startswith(f"{TILED}: value 'w_packed'"), str(info.value)


# ---------------------------------------------------------------- torch.ops


def test_torch_ops_cpu_kernel_is_the_reference_and_exports():
    args, _ = linear_args((2, 3), 64, 6, 32, torch.Generator().manual_seed(9))
    got = torch.ops.etvk.linear_qta8a_qga4w.default(*args)
    assert_bit_equal(got, ref.linear_qta8a_qga4w(*args), "cpu kernel")
    _, _, _, weight, gs, ws, wz = args

    class Module(torch.nn.Module):
        def forward(self, x, s, z):
            return torch.ops.etvk.linear_qta8a_qga4w.default(x, s, z, weight, gs, ws, wz)

    program = torch.export.export(Module(), args[:3])
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "etvk.linear_qta8a_qga4w.default" in targets
    assert_bit_equal(program.module()(*args[:3]), got, "exported program")
