"""q8ta_binary family (int8 add, mul, channel concat) on the default Vulkan device, validation on.

Every case of `runtime.tools.examples_q8ta_binary` runs in every packed
layout, with device inputs, and must equal the reference bit for bit, padding
bytes included (the raw output words are compared with the packed reference).
The reference must equal PyTorch's decomposed path (quantized_decomposed
dequantize -> aten op -> [relu] -> quantize_per_tensor) bit for bit, on the
cases and on every pair of int8 values under random qparams; so must the
shaders on those pairs. The concat writes 16-byte quads where its layout and
channels allow (the dispatch's size says which path ran) and one word an
invocation within `one_word_each`, both checked. Layouts flow from inputs to
the output, a host input takes the device input's layout, and bad arguments
name the op and argument.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

import runtime
from runtime.families.q8ta_copy import one_word_each
from runtime.reference import q8ta_binary as ref
from runtime.reference.quantize import fp32
from runtime.tools.examples_q8ta_binary import (
    BINARY_BY_NAME,
    BINARY_CASES,
    CONCAT_BY_NAME,
    CONCAT_CASES,
    binary_inputs,
    concat_inputs,
)
from runtime.vulkan import layouts
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OPS = {"add": "etvk.q8ta_add.default", "mul": "etvk.q8ta_mul.default",
       "concat": "etvk.q8ta_concat.default"}
SHADERS = {"add": "q8ta_binary", "mul": "q8ta_binary", "concat": "q8ta_concat"}


def pytorch_decomposed(kind, a, a_scale, a_zero_point, b, b_scale, b_zero_point,
                       output_scale, output_zero_point, activation="none"):
    """PyTorch's own graph for the op: dequantize both, the aten op, relu, quantize."""
    qd = torch.ops.quantized_decomposed
    ra = qd.dequantize_per_tensor(a, a_scale, a_zero_point, -128, 127, torch.int8)
    rb = qd.dequantize_per_tensor(b, b_scale, b_zero_point, -128, 127, torch.int8)
    if kind == "concat":
        y = torch.ops.aten.cat.default([ra, rb], 1)
    else:
        y = {"add": torch.ops.aten.add.Tensor, "mul": torch.ops.aten.mul.Tensor}[kind](ra, rb)
    if activation == "relu":
        y = torch.ops.aten.relu.default(y)
    return qd.quantize_per_tensor(y, output_scale, output_zero_point, -128, 127, torch.int8)


def reference(kind, *args):
    return getattr(ref, f"q8ta_{kind}")(*args)


def run_on_device(kind, args, layout):
    """Runs the op on device inputs in `layout`; returns the output's raw words and values."""
    op = runtime.get_op(OPS[kind])
    with Stream() as stream:
        a = Tensor.from_torch(args[0], layout=layout)
        b = Tensor.from_torch(args[3], layout=layout)
        out = op.record(stream, a, *args[1:3], b, *args[4:])
        stream.run()
        assert out.layout == layout
        raw = torch.empty(4 * layouts.packed_words(out.shape, layout), dtype=torch.int8)
        out.memory.read(raw.data_ptr(), raw.numel())
        return raw, out.to_torch()


def _cases():
    params = [pytest.param(case.op, case.name, binary_inputs(case), id=case.name)
              for case in BINARY_CASES]
    params += [pytest.param("concat", case.name, concat_inputs(case), id=case.name)
               for case in CONCAT_CASES]
    return params


def concat_quads(layout, a, b) -> bool:
    """Whether q8ta_concat of `a` and `b` in `layout` writes 16-byte quads: always in 4W4C, in
    4C1W for W % 4 == 0, in 4C for C_a % 16 == 0 and b's channel words a multiple of 4."""
    if layout == "4C":
        return a.shape[1] % 16 == 0 and -(-b.shape[1] // 4) % 4 == 0
    return layout == "4W4C" or a.shape[3] % 4 == 0


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize(("kind", "name", "args"), _cases())
def test_case_matches_reference_and_pytorch(kind, name, args, layout, dispatch_trace, dispatch_trace_path):
    want = reference(kind, *args)
    assert torch.equal(want, pytorch_decomposed(kind, *args)), f"{name}: reference != PyTorch"
    raw, got = run_on_device(kind, args, layout)
    if kind == "concat":
        words = raw.numel() // 4
        quads = concat_quads(layout, args[0], args[3])
        dispatched = json.loads(dispatch_trace_path.read_text().splitlines()[-1])["global"][0]
        assert dispatched == (words // 4 if quads else words), f"{name} {layout}: quads {quads}"
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    # Padding channels (and 4W4C padding widths) must be written as 0 bytes.
    assert torch.equal(raw, layouts.pack(want, layout)), f"{name} {layout}: padding bytes not 0"
    assert SHADERS[kind] in dispatch_trace()


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("name", [case.name for case in CONCAT_CASES])
def test_concat_one_word_each_matches_reference(name, layout, dispatch_trace_path):
    """The one-word kernel (the path of shapes that no quads fit, forced for all here)."""
    args = concat_inputs(CONCAT_BY_NAME[name])
    with one_word_each():
        raw, got = run_on_device("concat", args, layout)
    assert json.loads(dispatch_trace_path.read_text().splitlines()[-1])["global"][0] == raw.numel() // 4
    want = reference("concat", *args)
    assert torch.equal(got, want), f"{name} {layout}: {int((got != want).sum())} values differ"
    assert torch.equal(raw, layouts.pack(want, layout)), f"{name} {layout}: padding bytes not 0"


@pytest.mark.parametrize("name", ["inception_concat_c8_c12", "concat_same_qparams_c5_c6",
                                  "concat_c1_c2"])
def test_concat_copies_inputs_in_the_output_qparams(name):
    case = CONCAT_BY_NAME[name]
    args = concat_inputs(case)
    got = runtime.get_op(OPS["concat"])(*args)
    if case.a == case.out:
        assert torch.equal(got[:, : case.C_a], args[0])
    if case.b == case.out:
        assert torch.equal(got[:, case.C_a :], args[3])
    assert case.a == case.out or case.b == case.out


def all_pairs():
    """a and b [1, 16, 64, 64] holding every pair of int8 values once."""
    k = torch.arange(65536)
    a = (k % 256 - 128).to(torch.int8).reshape(1, 16, 64, 64)
    b = (k // 256 - 128).to(torch.int8).reshape(1, 16, 64, 64)
    return a, b


def random_qparams(gen, count):
    """`count` sets of (a_scale, a_zero_point, b_scale, b_zero_point, output_scale,
    output_zero_point): scales log-uniform over [2^-12, 2^2], any int8 zero point."""
    scales = torch.exp2(torch.rand(count, 3, generator=gen, dtype=torch.float64) * 14 - 12).tolist()
    zps = torch.randint(-128, 128, (count, 3), generator=gen).tolist()
    return [(s[0], z[0], s[1], z[1], s[2], z[2]) for s, z in zip(scales, zps, strict=True)]


def test_requantizing_to_the_same_qparams_is_an_exact_copy():
    """Every int8 value survives float32(q - zp) * fp32(s) * fp32(1 / s) for any valid s (the
    three roundings move k = q - zp by at most 255 * 2^-22), so chained concats equal one
    N-way concat; checked for 40 random qparams and scales at both ends of the valid range."""
    gen = torch.Generator().manual_seed(3)
    values = torch.arange(-128, 128, dtype=torch.int8)
    a = values[:200].reshape(1, 5, 5, 8)  # C_a = 5: b starts inside a channel word
    b = values[200:].reshape(1, 7, 1, 8).expand(1, 7, 5, 8).contiguous()
    qparams = [(s, z) for s, z, *_ in random_qparams(gen, 40)]
    qparams += [(2.0**-32, -128), (2.0**32, 127)]
    concat = runtime.get_op(OPS["concat"])
    for scale, zp in qparams:
        got = concat(a, scale, zp, b, scale, zp, scale, zp)
        assert torch.equal(got, torch.cat([a, b], dim=1)), f"scale {scale}, zero point {zp}"


@pytest.mark.parametrize(("kind", "activation"),
                         [("add", "none"), ("add", "relu"), ("mul", "none"), ("mul", "relu"),
                          ("concat", None)])
def test_reference_equals_pytorch_on_every_int8_pair(kind, activation):
    """24 random qparam sets x 65536 pairs (concat: 131072 values) each, bit for bit."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{kind} {activation}".encode()))
    a, b = all_pairs()
    for sa, za, sb, zb, so, zo in random_qparams(gen, 24):
        if kind == "mul":  # an output scale near the product's, as a calibrated model has
            so = sa * sb * 128 * math.exp2(float(torch.rand((), generator=gen)) * 4 - 2)
        args = (a, sa, za, b, sb, zb, so, zo, *(() if kind == "concat" else (activation,)))
        want = pytorch_decomposed(kind, *args)
        got = reference(kind, *args)
        differ = int((got != want).sum())
        assert not differ, f"{kind} {args[1:3]} {args[4:]}: {differ} differ"


@pytest.mark.parametrize("kind", ["add", "mul", "concat"])
def test_shader_equals_pytorch_on_every_int8_pair(kind):
    gen = torch.Generator().manual_seed(11)
    a, b = all_pairs()
    qparams = random_qparams(gen, len(PACKED_LAYOUTS))
    for layout, (sa, za, sb, zb, so, zo) in zip(PACKED_LAYOUTS, qparams, strict=True):
        if kind == "mul":
            so = sa * sb * 64
        activation = () if kind == "concat" else ("relu" if layout == "4C" else "none",)
        args = (a, sa, za, b, sb, zb, so, zo, *activation)
        _, got = run_on_device(kind, args, layout)
        want = pytorch_decomposed(kind, *args)
        differ = int((got != want).sum())
        assert not differ, f"{kind} {layout}: {differ} of {want.numel()} differ"


def test_the_output_reciprocal_is_pytorchs():
    """Halving requantizations put every odd value on a tie that only the reciprocal's
    last bit decides: fp32(1.0 / s) (PyTorch, float64 division) against
    fp32(1) / fp32(s) changes about a fifth of the outputs, so this tells them apart."""
    a, b = all_pairs()
    gen = torch.Generator().manual_seed(5)
    candidates = torch.exp2(torch.rand(40, generator=gen, dtype=torch.float64) * 6 - 8).tolist()
    s = next(s for s in candidates if fp32(1.0 / s) != fp32(1.0 / fp32(s)))
    args = (a, fp32(s) / 2, 0, b, fp32(s) / 2, -1, s, 2)
    want = pytorch_decomposed("concat", *args)
    y = torch.cat([a.float() * args[1], (b.float() + 1) * args[4]], dim=1)
    other = (torch.round(y * fp32(1.0 / fp32(s))) + 2).clamp(-128, 127).to(torch.int8)
    assert (other != want).double().mean().item() > 0.1
    assert torch.equal(reference("concat", *args), want)
    assert torch.equal(run_on_device("concat", args, "4C")[1], want)


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
def test_a_host_input_takes_the_device_inputs_layout(layout):
    for kind, args in (("add", binary_inputs(BINARY_BY_NAME["add_c6_w5_batch2"])),
                       ("mul", binary_inputs(BINARY_BY_NAME["se_gate_mul_c10_w3"])),
                       ("concat", concat_inputs(CONCAT_BY_NAME["concat_c7_c6_batch2"]))):
        op = runtime.get_op(OPS[kind])
        want = reference(kind, *args)
        for device_arg in (0, 3):
            moved = list(args)
            moved[device_arg] = Tensor.from_torch(args[device_arg], layout=layout)
            with Stream() as stream:
                out = op.record(stream, *moved)
                stream.run()
                assert out.layout == layout, f"{kind}: output in {out.layout}"
                assert torch.equal(out.to_torch(), want), f"{kind} {layout} device arg {device_arg}"


def test_host_inputs_default_to_4c1w_and_torch_ops_use_the_reference():
    args = binary_inputs(BINARY_BY_NAME["resnet_residual_add_relu"])
    op = runtime.get_op(OPS["add"])
    with Stream() as stream:
        out = op.record(stream, *args)
        stream.run()
        assert out.layout == "4C1W"
        assert torch.equal(out.to_torch(), ref.q8ta_add(*args))
    no_activation = args[:-1]  # activation defaults to "none"
    want = ref.q8ta_add(*no_activation, "none")
    assert torch.equal(torch.ops.etvk.q8ta_add.default(*no_activation), want)
    assert torch.equal(op(*no_activation), want)


def _bad(kind, case_name, arg, value):
    case = (CONCAT_BY_NAME if kind == "concat" else BINARY_BY_NAME)[case_name]
    args = list(concat_inputs(case) if kind == "concat" else binary_inputs(case))
    names = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "output_scale",
             "output_zero_point", "activation"]
    args[names.index(arg)] = value
    return args


BAD_ARGS = [
    ("add", "add_c6_w5_batch2", "a", torch.zeros(2, 6, 3, 5), "int8"),
    ("add", "add_c6_w5_batch2", "a", torch.zeros(6, 3, 5, dtype=torch.int8), "[N, C, H, W]"),
    ("mul", "add_c6_w5_batch2", "b", torch.zeros(2, 6, 3, 5, dtype=torch.int32), "int8"),
    ("add", "add_c6_w5_batch2", "b", torch.zeros(2, 6, 3, 4, dtype=torch.int8),
     "a's shape (2, 6, 3, 5)"),
    ("mul", "add_c6_w5_batch2", "b", torch.zeros(2, 6, 1, 5, dtype=torch.int8), "[N, C, 1, 1]"),
    ("add", "add_c6_w5_batch2", "b", torch.zeros(1, 6, 1, 1, dtype=torch.int8), "[N, C, 1, 1]"),
    ("concat", "concat_c5_c7", "b", torch.zeros(1, 7, 3, 4, dtype=torch.int8), "N, H and W"),
    ("concat", "concat_c5_c7", "b", torch.zeros(2, 7, 3, 5, dtype=torch.int8), "N, H and W"),
    ("add", "add_c6_w5_batch2", "a_scale", 0.0, "> 0"),
    ("mul", "add_c6_w5_batch2", "a_scale", -0.5, "> 0"),
    ("add", "add_c6_w5_batch2", "b_scale", math.nan, "finite"),
    ("concat", "concat_c5_c7", "b_scale", math.inf, "finite"),
    ("add", "add_c6_w5_batch2", "output_scale", 1e-12, "[2^-32, 2^32]"),
    ("concat", "concat_c5_c7", "output_scale", 0.0, "> 0"),
    ("add", "add_c6_w5_batch2", "a_zero_point", 128, "[-128, 127]"),
    ("mul", "add_c6_w5_batch2", "b_zero_point", -129, "[-128, 127]"),
    ("concat", "concat_c5_c7", "output_zero_point", 300, "[-128, 127]"),
    ("add", "add_c6_w5_batch2", "activation", "relu6", "'none' or 'relu'"),
    ("mul", "add_c6_w5_batch2", "activation", None, "expected a str"),
    ("add", "add_c6_w5_batch2", "a_zero_point", 1.5, "expected an int"),
    ("concat", "concat_c5_c7", "a_scale", "0.1", "expected a float"),
]


@pytest.mark.parametrize(("kind", "case_name", "arg", "value", "text"), BAD_ARGS,
                         ids=[f"{k}-{a}-{t}" for k, _, a, _, t in BAD_ARGS])
def test_bad_arguments_name_the_op_and_argument(kind, case_name, arg, value, text):
    op = runtime.get_op(OPS[kind])
    with pytest.raises((ValueError, TypeError)) as info:
        op(*_bad(kind, case_name, arg, value))
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message


@pytest.mark.parametrize("kind", ["add", "concat"])
def test_device_inputs_in_different_layouts_are_refused(kind):
    args = list(binary_inputs(BINARY_BY_NAME["add_c6_w5_batch2"]) if kind == "add"
                else concat_inputs(CONCAT_BY_NAME["concat_c5_c7"]))
    args[0] = Tensor.from_torch(args[0], layout="4C")
    args[3] = Tensor.from_torch(args[3], layout="4C1W")
    op = runtime.get_op(OPS[kind])
    with pytest.raises(ValueError, match=rf"^{op.name}: argument 'b'.* in 4C1W, but a is in 4C"):
        op(*args)


def test_cases_cover_what_they_claim():
    """The tables keep the shapes the tests rely on (C_a % 4 of every kind, broadcast, relu,
    and unbroadcast add / mul with and without padding channels and 4W4C padding widths)."""
    assert {c.C_a % 4 for c in CONCAT_CASES} == {0, 1, 2, 3}
    kinds = {(c.op, c.broadcast) for c in BINARY_CASES}
    assert kinds == {(op, b) for op in ("add", "mul") for b in (False, True)}
    assert {c.activation for c in BINARY_CASES} == {"none", "relu"}
    plain = [c for c in BINARY_CASES if not c.broadcast]
    assert any(c.a_shape[1] % 4 == 0 and c.a_shape[3] % 4 == 0 for c in plain)
    assert any(c.a_shape[1] % 4 == 0 and c.a_shape[3] % 4 != 0 for c in plain)
    assert any(c.a_shape[1] % 4 != 0 for c in plain)
    assert any(dataclasses.astuple(c.a) == dataclasses.astuple(c.out) for c in CONCAT_CASES)
    # quads: in 4C1W with b shifted (C_a % 4 != 0) and more than one quad a row, in 4C, and
    # shapes where no quads fit in 4C1W (W % 4 != 0) and 4C
    shapes = [((c.N, c.C_a, c.H, c.W), (c.N, c.C_b, c.H, c.W)) for c in CONCAT_CASES]
    fits = {layout: [concat_quads(layout, torch.empty(a), torch.empty(b)) for a, b in shapes]
            for layout in ("4C", "4C1W")}
    assert any(f and a[1] % 4 and a[3] > 4 for f, (a, _) in zip(fits["4C1W"], shapes, strict=True))
    assert all(any(f) and not all(f) for f in fits.values())
