"""Int8 pooling family (q8ta_pool) on the default Vulkan device, validation on.

Every op runs every case of `runtime.tools.examples_q8ta_pool` from a host
input and from a device input in each packed layout, bit-exact against the
reference (the raw output words too, so padding bytes must be 0); the window
sum of every case with full windows equals each window's int8 values summed. Max
pooling is bit-exact against PyTorch's decomposed path (dequantize ->
max_pool2d -> quantize); the average pools are at most one step from it, and
only where the exact average is a rounding tie. A seeded grid of random
geometries checks PyTorch's shape rules, divisors and rejections; bad
arguments name the op and the argument.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
from op_testlib import assert_argument_error

import runtime
from runtime.families.pool2d import (
    CASCADE_STREAMS,
    avg_pool2d_divisors,
    cascade_sum,
    global_pool_tiling,
    pool2d_params,
)
from runtime.reference import q8ta_pool as ref
from runtime.reference.quantize import quantize_per_tensor as ref_quantize_per_tensor
from runtime.tools.examples_q8ta_pool import (
    GLOBAL_CASES,
    GLOBAL_CASES_BY_NAME,
    WINDOW_CASES,
    WINDOW_CASES_BY_NAME,
    avg_pool_args,
    global_pool_args,
    max_pool_args,
    window_sum_args,
)
from runtime.vulkan import layouts
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OPS = {
    "max": "etvk.q8ta_max_pool2d.default",
    "avg": "etvk.q8ta_avg_pool2d.default",
    "global": "etvk.q8ta_global_avg_pool2d.default",
}
WINDOW_SUM = "etvk.q8ta_window_sum.default"
VARIANTS = {"max": "q8ta_pool2d_max", "avg": "q8ta_pool2d_avg", "global": "q8ta_global_avg_pool2d"}
BUILDERS = {"max": max_pool_args, "avg": avg_pool_args, "global": global_pool_args}
QD = torch.ops.quantized_decomposed


def _cases():
    params = [pytest.param("max", c, id=f"max-{c.name}") for c in WINDOW_CASES]
    params += [pytest.param("avg", c, id=f"avg-{c.name}") for c in WINDOW_CASES if c.is_avg]
    params += [pytest.param("global", c, id=f"global-{c.name}") for c in GLOBAL_CASES]
    return params


def leave_dirty_buffer(shape, layout: str) -> None:
    """Leaves a spare buffer of a packed tensor's size full of 0xFF bytes; the next
    allocation of that size recycles it, so bytes a shader forgets to write show up."""
    spare = Tensor.empty(shape, torch.int8, layout=layout)
    junk = torch.full((4 * layouts.packed_words(shape, layout),), -1, dtype=torch.int8)
    spare.memory.write(junk.data_ptr(), junk.numel())
    del spare


def packed_bytes(t: Tensor) -> torch.Tensor:
    """The raw bytes of a packed device tensor, padding included."""
    data = torch.empty(4 * layouts.packed_words(t.shape, t.layout), dtype=torch.int8)
    t.memory.read(data.data_ptr(), data.numel())
    return data


@pytest.mark.parametrize(("kind", "case"), _cases())
def test_every_layout_matches_the_reference_bit_exactly(kind, case, dispatch_trace):
    check_every_layout(runtime.get_op(OPS[kind]), BUILDERS[kind](case), case.name)
    assert VARIANTS[kind] in dispatch_trace(), f"{VARIANTS[kind]} never reached the device"


def check_every_layout(op, args: tuple, name: str) -> None:
    """`op` on `args` from a host input (the default layout) and from a device input in each
    packed layout, bit-exact against its reference, padding bytes included."""
    want = op.reference(*args)
    got = op(*args)  # a host input, packed in the default layout
    assert torch.equal(got, want), f"{name} host input: {(got != want).sum()} values differ"
    for layout in layouts.PACKED_LAYOUTS:
        leave_dirty_buffer(want.shape, layout)
        with Stream() as stream:
            x = Tensor.from_torch(args[0], layout=layout)
            out = op.record(stream, x, *args[1:])
            stream.run()
            assert out.layout == layout
            assert torch.equal(packed_bytes(out), layouts.pack(want, layout)), f"{name} {layout}"


@pytest.mark.parametrize("case", [c for c in WINDOW_CASES if c.full_windows], ids=lambda c: c.name)
def test_window_sum_in_every_layout_is_the_sum_of_each_window(case, dispatch_trace):
    """The plain int32 sums from a host input and from a device input in each packed layout
    equal the reference, which equals each window's int8 values summed."""
    op = runtime.get_op(WINDOW_SUM)
    x, kernel, stride = window_sum_args(case)
    p = case.params
    want = op.reference(x, kernel, stride)
    windows = x.long().unfold(2, p.KH, p.stride[0]).unfold(3, p.KW, p.stride[1])
    assert want.dtype == torch.int32 and torch.equal(want.long(), windows.sum((-1, -2)))
    assert torch.equal(op(x, kernel, stride), want), f"{case.name} host input"
    for layout in layouts.PACKED_LAYOUTS:
        with Stream() as stream:
            out = op.record(stream, Tensor.from_torch(x, layout=layout), kernel, stride)
            stream.run()
            assert out.layout == "contiguous"
            assert torch.equal(out.to_torch(), want), f"{case.name} {layout}"
    assert "q8ta_window_sum" in dispatch_trace()


def test_window_sum_bad_arguments_name_the_op_and_argument():
    op = runtime.get_op(WINDOW_SUM)
    x = torch.zeros(1, 4, 3, 3, dtype=torch.int8)
    assert_argument_error(op, (x, [4], [1]), "kernel_size", "does not fit the 3x3 input")
    assert_argument_error(op, (x, [0], [1]), "kernel_size", "ints > 0")
    assert_argument_error(op, (x, [2], [0]), "stride", "ints > 0")
    assert_argument_error(op, (x.float(), [2], [2]), "x", "int8 [N, C, H, W]")


def aten_pool(name: str, *geometry):
    """The fp32 function ``aten.<name>(fp, *geometry)``."""
    return lambda fp: getattr(torch.ops.aten, name).default(fp, *geometry)


def pytorch_decomposed(pool, x, scale, zero_point, out_scale, out_zero_point):
    """quantized_decomposed dequantize -> `pool` (an fp32 function) -> quantize."""
    fp = QD.dequantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)
    return QD.quantize_per_tensor(pool(fp), out_scale, out_zero_point, -128, 127, torch.int8)


@pytest.mark.parametrize("scale", [0.05, 1 / 3, 0.0371, 2.0**-5])
def test_max_pool_bit_exact_with_pytorch(scale):
    """dequantize -> aten.max_pool2d -> quantize with the same qparams gives our int8 max."""
    op = runtime.get_op(OPS["max"])
    for case in WINDOW_CASES:
        x, *geometry = max_pool_args(case)
        want = pytorch_decomposed(aten_pool("max_pool2d", *geometry), x, scale, -7, scale, -7)
        assert torch.equal(op(x, *geometry), want), case.name


def _exact_average(sums, divisors, input_scale, output_scale):
    """The real-valued average in output steps (float64: the distance to a tie is what matters)."""
    return sums.double() * input_scale / (divisors.double() * output_scale)


def _agreement(got, want, exact_steps, what):
    """Asserts at most one step apart, and apart only where the exact average is within
    1e-5 of a rounding tie (the two fp32 orders break ties differently); returns the
    exact fraction."""
    steps = (got.to(torch.int32) - want.to(torch.int32)).abs()
    assert steps.max().item() <= 1, f"{what}: {steps.max().item()} steps from PyTorch"
    off = steps == 1
    tie_distance = ((exact_steps - exact_steps.floor()) - 0.5).abs()
    assert bool((tie_distance[off] < 1e-5).all()), f"{what}: a difference away from a tie"
    return 1.0 - off.double().mean().item()


@pytest.mark.parametrize("output_ratio", [1.0, 0.7316])
def test_avg_pool_agreement_with_pytorch(output_ratio):
    """Shared qparams (PT2E's choice, ratio 1) make exact ties common (2x2 windows: S/4);
    an output scale in general position has none."""
    op = runtime.get_op(OPS["avg"])
    exact = []
    for case in (c for c in WINDOW_CASES if c.is_avg):
        args = avg_pool_args(dataclasses.replace(case, output_ratio=output_ratio))
        x, s, zp, out_s, out_zp, kernel, stride, padding, ceil_mode, cip, divisor = args
        want = pytorch_decomposed(aten_pool("avg_pool2d", *args[5:]), x, s, zp, out_s, out_zp)
        p = pool2d_params(x.shape, kernel, stride, padding, [1], ceil_mode)
        sums = torch.ops.aten.avg_pool2d.default((x.double() - zp), kernel, stride, padding,
                                                 ceil_mode, True, 1)
        steps = _exact_average(sums, avg_pool2d_divisors(p, cip, divisor), s, out_s) + out_zp
        got = op(*args)
        exact.append((_agreement(got, want, steps, case.name), got.numel()))
    share = sum(e * n for e, n in exact) / sum(n for _, n in exact)
    print(f"avg_pool2d vs PyTorch, output_scale = {output_ratio} * input_scale: {share:.4%} exact")
    if output_ratio != 1.0:
        assert share == 1.0


GLOBAL_POOLS = {
    "mean": lambda fp: fp.mean(dim=[2, 3], keepdim=True),
    "adaptive_avg_pool2d": lambda fp: torch.nn.functional.adaptive_avg_pool2d(fp, 1),
    "avg_pool2d": lambda fp: torch.ops.aten.avg_pool2d.default(fp, list(fp.shape[2:])),
}


@pytest.mark.parametrize("path", list(GLOBAL_POOLS))
def test_global_pool_agreement_with_pytorch(path):
    """mean and adaptive_avg_pool2d(1) (PyTorch's mean) bit for bit, rounding ties included; a
    whole-map avg_pool2d (its own kernel, another order) at most a step apart, at ties."""
    op = runtime.get_op(OPS["global"])
    total = exact = 0
    for case in GLOBAL_CASES:
        x, s, zp, out_s, out_zp = args = global_pool_args(case)
        for out_scale in (out_s, s):  # the case's, and PT2E's shared qparams
            want = pytorch_decomposed(GLOBAL_POOLS[path], x, s, zp, out_scale, out_zp)
            got = op(*args[:3], out_scale, out_zp)
            if path != "avg_pool2d":
                assert torch.equal(got, want), f"{path} {case.name}"
            sums = (x.double() - zp).sum(dim=(2, 3), keepdim=True)
            steps = _exact_average(sums, torch.tensor(case.H * case.W), s, out_scale) + out_zp
            exact += _agreement(got, want, steps, f"{path} {case.name}") * got.numel()
            total += got.numel()
    print(f"global average pool vs PyTorch {path}: {exact / total:.4%} exact of {total}")


@pytest.mark.parametrize(("h", "w"), [(7, 7), (17, 19), (112, 112)])
def test_global_pool_keeps_the_summation_order(h, w):
    """Maps whose channels are permutations of one map of values in +-pairs: every exact mean is
    0, so each fp32 mean is the rounding residue of its summation order, which differs from
    channel to channel; on an output scale that shows a few ulps of it the device equals the
    reference's order (any other order of the same additions would give other residues)."""
    gen = torch.Generator().manual_seed(12)
    half = torch.randint(1, 128, (h * w // 2,), generator=gen, dtype=torch.int8)
    first = torch.cat([half, -half, torch.zeros(h * w % 2, dtype=torch.int8)])
    x = torch.stack([first[torch.randperm(h * w, generator=gen)] for _ in range(8)]).view(1, 8, h, w)
    args = (x, 0.0123457, 0, 1e-9, 0)
    want = ref.q8ta_global_avg_pool2d(*args)
    assert len(set(want.flatten().tolist())) > 2, "the residues do not tell the orders apart"
    got = runtime.get_op(OPS["global"])(*args)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {want.numel()} means differ"


def test_power_of_two_scales_are_bit_exact_with_pytorch():
    """With scale 2^-5 every fp32 step of PyTorch's path is exact too: nothing to differ."""
    avg, glob = runtime.get_op(OPS["avg"]), runtime.get_op(OPS["global"])
    for case in (c for c in WINDOW_CASES if c.is_avg and c.divisor_override is None):
        x, _, zp, _, out_zp, *geometry = avg_pool_args(case)
        want = pytorch_decomposed(aten_pool("avg_pool2d", *geometry), x, 2.0**-5, zp, 2.0**-3, out_zp)
        got = avg(x, 2.0**-5, zp, 2.0**-3, out_zp, *geometry)
        assert torch.equal(got, want), case.name
    x, _, zp, _, out_zp = global_pool_args(GLOBAL_CASES_BY_NAME["map_56x56_c64"])
    want = pytorch_decomposed(GLOBAL_POOLS["mean"], x, 2.0**-4, zp, 2.0**-7, out_zp)
    assert torch.equal(glob(x, 2.0**-4, zp, 2.0**-7, out_zp), want)


@pytest.mark.parametrize(("scale", "out_scale"), [(1e-20, 1e-20), (1e20, 1e20), (1e-20, 1e20),
                                                  (1e20, 1e-20)])
def test_extreme_scales_stay_bit_exact(scale, out_scale):
    """The ends of the accepted scale range: the correctly rounded division stays exact
    (no overflow or subnormal in its residuals), saturation clamps."""
    avg, glob = runtime.get_op(OPS["avg"]), runtime.get_op(OPS["global"])
    x, _, zp, _, out_zp, *geometry = avg_pool_args(WINDOW_CASES_BY_NAME["divisor_override_negative"])
    args = (x, scale, zp, out_scale, out_zp, *geometry)
    assert torch.equal(avg(*args), avg.reference(*args))
    x, _, zp, _, out_zp = global_pool_args(GLOBAL_CASES_BY_NAME["map_56x56_c64"])
    args = (x, scale, zp, out_scale, out_zp)
    assert torch.equal(glob(*args), glob.reference(*args))


def _random_geometries(count: int, seed: int):
    """Seeded pooling geometries around PyTorch's edges: sizes 1-8, kernels 1-4,
    strides 1-3 or empty, paddings 0-2, dilations 1-3, both ceil modes."""
    gen = torch.Generator().manual_seed(seed)

    def pick(lo, hi, n=2):
        return [int(v) for v in torch.randint(lo, hi + 1, (n,), generator=gen)]

    for _ in range(count):
        stride = pick(1, 3) if int(torch.randint(0, 4, (), generator=gen)) else []
        yield (pick(1, 8), pick(1, 4), stride, pick(0, 2), pick(1, 3),
               bool(torch.randint(0, 2, (), generator=gen)))


def _torch_or_error(fn, *args):
    try:
        return fn(*args)
    except RuntimeError:
        return None


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_random_geometries_follow_pytorch(kind):
    """Where PyTorch pools, we give its shape and values (max: bit-exact with its
    decomposed path; avg: the reference, whose divisors must be PyTorch's); where it
    refuses, we refuse naming an argument."""
    op = runtime.get_op(OPS[kind])
    gen = torch.Generator().manual_seed(5)
    ran = refused = 0
    for hw, kernel, stride, padding, dilation, ceil_mode in _random_geometries(160, 17):
        x = torch.randint(-128, 128, (1, 5, *hw), generator=gen, dtype=torch.int8)
        if kind == "max":
            args = (x, kernel, stride, padding, dilation, ceil_mode)
            want = _torch_or_error(pytorch_decomposed, aten_pool("max_pool2d", *args[1:]),
                                   x, 0.05, 3, 0.05, 3)
        else:
            cip = bool(sum(kernel) % 2)
            args = (x, 0.05, 3, 0.05, 3, kernel, stride, padding, ceil_mode, cip, None)
            ones = torch.ones(1, 1, *hw, dtype=torch.float64)
            average = _torch_or_error(aten_pool("avg_pool2d", *args[5:10]), ones)
            want = None if average is None else op.reference(*args)
            if want is not None:  # PyTorch's divisors: the taps inside the image / the average
                taps = aten_pool("avg_pool2d", *args[5:10], 1)(ones)
                torch_divisors = (taps / average)[0, 0].round().to(torch.int64)
        if want is None:
            with pytest.raises(ValueError, match=rf"^{op.name}: argument '\w+'"):
                op(*args)
            refused += 1
            continue
        assert torch.equal(op(*args), want), f"{args[1:]}"
        if kind == "avg":
            p = pool2d_params(x.shape, kernel, stride, padding, [1], ceil_mode)
            divisors = avg_pool2d_divisors(p, cip, None)
            assert torch.equal(divisors, torch_divisors), f"{args[5:]}"
        ran += 1
    assert ran > 40 and refused > 10, (ran, refused)


@pytest.mark.parametrize(("shape", "workers"), [
    ((1, 2048, 7, 7), 1), ((1, 64, 28, 28), 1), ((1, 64, 56, 56), 2), ((1, 32, 112, 112), 8),
    ((1, 4, 136, 136), 8), ((2, 13, 5, 3), 1), ((1, 6, 1, 1), 1), ((3, 9, 17, 19), 1)])
def test_global_tiling_covers_every_word(shape, workers):
    """Workers per stream: the fewest (up to 8) that sum a stream's whole level-0 blocks in one
    round of GLOBAL_POOL_BLOCKS each (28x28: 1 block; 56x56: 6; 112x112: 24; 136x136: 36,
    two rounds); every channel word gets them all."""
    t = global_pool_tiling(shape)
    assert t.workers == workers
    assert t.words * t.workers * CASCADE_STREAMS == 256
    assert t.groups[0] * t.words >= shape[0] * math.ceil(shape[1] / 4)


@pytest.mark.parametrize("length", [*range(1, 40), 48, 49, 64, 65, 196, 255, 257, 784, 3136, 12544])
def test_cascade_sum_is_pytorchs_sum(length):
    """cascade_sum (the global pool's order) against torch.sum over rows of fp32 values, bit for
    bit: short rows, whole and partial vectors and interleaved groups, cascades that carry."""
    gen = torch.Generator().manual_seed(length)
    values = (torch.randint(-128, 128, (64, length), generator=gen).float() - 3) * 0.0123457
    assert torch.equal(cascade_sum(values), values.sum(dim=1))


def test_global_pool_reference_is_pytorchs_mean():
    """The reference global pool equals PyTorch's adaptive_avg_pool2d(1) of the dequantized
    values, quantized, on every value: rounding ties included (half the cases share the input's
    scale, where H*W of 2, 4, 8 ... puts many means on a tie)."""
    gen = torch.Generator().manual_seed(5)
    for case in range(60):
        h, w = (int(v) for v in torch.randint(1, 20, (2,), generator=gen))
        x = torch.randint(-128, 128, (2, 8, h, w), generator=gen, dtype=torch.int8)
        scale = float(torch.rand((), generator=gen)) * 0.1 + 1e-3
        zero_point = int(torch.randint(-128, 128, (), generator=gen))
        out_scale = scale if case % 2 else scale * 1.37
        dequantized = (x.float() - zero_point) * torch.tensor(scale)
        want = ref_quantize_per_tensor(torch.nn.functional.adaptive_avg_pool2d(dequantized, 1), out_scale, 3,
                                       -128, 127, torch.int8)
        assert torch.equal(ref.q8ta_global_avg_pool2d(x, scale, zero_point, out_scale, 3), want), (h, w)


def _bad(kind, case_name, changes, arg, text):
    return pytest.param(kind, case_name, changes, arg, text, id=f"{kind}-{arg}-{text}")


WINDOW = "saturating_avg"
BAD_ARGS = [
    _bad("max", WINDOW, {0: torch.zeros(3, 13, 5, 11)}, "x", "int8"),
    _bad("max", WINDOW, {0: torch.zeros(13, 5, 11, dtype=torch.int8)}, "x", "[N, C, H, W]"),
    _bad("max", WINDOW, {0: torch.zeros(1, 0, 5, 11, dtype=torch.int8)}, "x", "C, H, W > 0"),
    _bad("max", WINDOW, {1: []}, "kernel_size", "1 or 2 ints > 0"),
    _bad("max", WINDOW, {1: [0, 2]}, "kernel_size", "1 or 2 ints > 0"),
    _bad("max", WINDOW, {1: [2, 2, 2]}, "kernel_size", "1 or 2 ints > 0"),
    _bad("max", WINDOW, {2: [0]}, "stride", "> 0"),
    _bad("max", WINDOW, {2: [1, 1, 1]}, "stride", "empty (the kernel size)"),
    _bad("max", WINDOW, {3: [2, 0]}, "padding", "at most half the kernel size (3, 2)"),
    _bad("max", WINDOW, {3: [-1]}, "padding", ">= 0"),
    _bad("max", WINDOW, {4: [1, 0]}, "dilation", "> 0"),
    _bad("max", WINDOW, {1: [3, 3], 3: [0], 4: [3]}, "kernel_size", "the output would be empty"),
    _bad("max", WINDOW, {5: 1}, "ceil_mode", "expected a bool"),
    _bad("avg", WINDOW, {5: [7, 2], 7: [0]}, "kernel_size", "the output would be empty"),
    _bad("avg", WINDOW, {5: [4096, 4096], 7: [0]}, "kernel_size", "2^23 taps"),
    _bad("avg", WINDOW, {10: 0}, "divisor_override", "nonzero"),
    _bad("avg", WINDOW, {10: 2**25}, "divisor_override", "[-2^24, 2^24]"),
    _bad("avg", WINDOW, {1: 0.0}, "input_scale", "[1e-20, 1e20]"),
    _bad("avg", WINDOW, {1: math.inf}, "input_scale", "[1e-20, 1e20]"),
    _bad("avg", WINDOW, {3: -1.0}, "output_scale", "[1e-20, 1e20]"),
    _bad("avg", WINDOW, {2: 200}, "input_zero_point", "int8"),
    _bad("avg", WINDOW, {4: -129}, "output_zero_point", "int8"),
    _bad("avg", WINDOW, {9: "yes"}, "count_include_pad", "expected a bool"),
    _bad("avg", WINDOW, {10: 2.5}, "divisor_override", "expected an int"),
    _bad("global", "map_5x3_c13_batch2", {0: torch.zeros(2, 13, 5, 3, dtype=torch.int32)}, "x",
         "int8"),
    _bad("global", "map_5x3_c13_batch2",
         {0: torch.zeros(1, 1, 1, 1, dtype=torch.int8).expand(1, 1, 4096, 2049)}, "x", "2^23"),
    _bad("global", "map_5x3_c13_batch2", {1: 1e-25}, "input_scale", "[1e-20, 1e20]"),
    _bad("global", "map_5x3_c13_batch2", {3: math.nan}, "output_scale", "[1e-20, 1e20]"),
    _bad("global", "map_5x3_c13_batch2", {4: 128}, "output_zero_point", "int8"),
]


@pytest.mark.parametrize(("kind", "case_name", "changes", "arg", "text"), BAD_ARGS)
def test_bad_arguments_name_the_op_and_argument(kind, case_name, changes, arg, text):
    op = runtime.get_op(OPS[kind])
    case = (GLOBAL_CASES_BY_NAME if kind == "global" else WINDOW_CASES_BY_NAME)[case_name]
    args = list(BUILDERS[kind](case))
    for index, value in changes.items():
        args[index] = value
    assert_argument_error(op, args, arg, text)


def test_a_device_input_must_be_packed():
    op = runtime.get_op(OPS["global"])
    x, *rest = global_pool_args(GLOBAL_CASES_BY_NAME["map_5x3_c13_batch2"])
    with pytest.raises(ValueError, match=rf"^{op.name}: argument 'x'.*packed layout"):
        op(Tensor.from_torch(x), *rest)
