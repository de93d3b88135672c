"""What the int8 conv tests share: PyTorch's own int8 convs and comparisons in steps.

- `qnnpack_conv2d`: PyTorch's quantized conv on the QNNPACK engine, with relu
  fused and hardtanh as PyTorch's quantized hardtanh of its output;
- `decomposed_conv2d`: the fp32 path a PT2E graph spells out, dequantize ->
  conv2d -> activation -> quantize (the only PyTorch path for hardswish);
- `pytorch_conv2d`: the first for every activation it serves, else the second;
- `steps_apart`: asserts two int8 results are at most one step apart and
  returns the exact fraction;
- `CONV_OPS`, `TINY` and `variant_layouts`: the algorithm ops, a tiny case of
  each, and every variant with every input layout it reads;
- `routed_cases`: a case per route of the dispatcher's rule on a device family;
- `residual_args`: a random residual and the qparams of the add after a conv;
- `random_lut`: a random lookup table for the conv epilogue (its entry for 0 not 0);
- `packed_bytes`: the raw bytes of a packed device tensor;
- `variant_args`: a case's arguments for one variant (x uploaded in 4W4C for the specialised
  im2col, which reads no other layout).

Imported by tests/ops/test_conv2d*.py (pytest puts this folder on sys.path).
No Vulkan.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

import runtime
from runtime.families.conv2d import choose_algorithm
from runtime.tools.examples_conv2d import CASES, CASES_BY_NAME, Conv2dInputs
from runtime.vulkan.layouts import PACKED_LAYOUTS, packed_words
from runtime.vulkan.tensor import Tensor

MIN_EXACT = 0.995
CONV_OPS = {
    "general": "etvk.q8ta_conv2d_general.default",
    "im2col": "etvk.q8ta_conv2d_im2col.default",
    "pw": "etvk.q8ta_conv2d_pw.default",
    "dw": "etvk.q8ta_conv2d_dw.default",
}
# One tiny case per algorithm; "im2col" routes to im2col on every family.
TINY = {
    "general": "grouped_g3_cg5_cout9",
    "im2col": "batch2_3x3_cout10",
    "pw": "pointwise_cin6_cout7",
    "dw": "mobilenetv2_dw_c30_w13",
}
_DECOMPOSED = torch.ops.quantized_decomposed


def routed_cases(family: str) -> dict[str, str]:
    """For each route of ``etvk.q8ta_conv2d.default``'s rule on `family` (the keys of TINY), a
    case the rule sends there: TINY's where it does, else the first of CASES that goes there (on
    NVIDIA TINY's pointwise case, 6 input channels, goes to the direct conv). Asserts that every
    route has one, so a route no case reaches fails the dispatcher tests."""
    routed = {}
    for kind, tiny in TINY.items():
        names = [tiny] + [case.name for case in CASES]
        routed[kind] = next((name for name in names
                             if choose_algorithm(CASES_BY_NAME[name].params, family) == kind), None)
    assert None not in routed.values(), f"routes no case reaches on {family}: {routed}"
    return routed


def qnnpack_conv2d(inp: Conv2dInputs, per_channel: bool = True) -> torch.Tensor:
    """The conv on QNNPACK; int8 activations travel as quint8 shifted by 128.

    relu is QNNPACK's fused conv2d_relu; hardtanh is ``quantized.functional.hardtanh``
    of the conv's quantized output (PyTorch quantizes the bounds itself).
    """
    if inp.activation not in ("none", "relu", "hardtanh"):
        raise ValueError(f"QNNPACK has no fused {inp.activation}")
    if "qnnpack" not in torch.backends.quantized.supported_engines:
        pytest.skip("this PyTorch build has no QNNPACK engine")
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = "qnnpack"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # deprecated in 2.13, still works
            shifted = (inp.x.to(torch.int32) + 128).to(torch.uint8)
            qx = torch._make_per_tensor_quantized_tensor(shifted, inp.input_scale,
                                                         inp.input_zero_point + 128)
            if per_channel:
                zeros = torch.zeros(inp.weights.shape[0], dtype=torch.int64)
                qw = torch._make_per_channel_quantized_tensor(inp.weights,
                                                              inp.weight_scales.double(), zeros, 0)
            else:
                qw = torch._make_per_tensor_quantized_tensor(inp.weights,
                                                             float(inp.weight_scales[0]), 0)
            packed = torch.ops.quantized.conv2d_prepack(qw, inp.bias, inp.stride, inp.padding,
                                                        inp.dilation, inp.groups)
            conv = (torch.ops.quantized.conv2d_relu if inp.activation == "relu"
                    else torch.ops.quantized.conv2d)
            out = conv(qx, packed, inp.output_scale, inp.output_zero_point + 128)
            if inp.activation == "hardtanh":
                # contiguous(): PyTorch 2.13's quantized hardtanh on QNNPACK garbles
                # channels-last input (the conv's output).
                out = torch.ao.nn.quantized.functional.hardtanh(out.contiguous(),
                                                                inp.activation_min,
                                                                inp.activation_max)
    finally:
        torch.backends.quantized.engine = previous
    return (out.int_repr().to(torch.int32) - 128).to(torch.int8)


_FP_ACTIVATIONS = {
    "none": lambda y, inp: y,
    "relu": lambda y, inp: torch.relu(y),
    "hardtanh": lambda y, inp: torch.nn.functional.hardtanh(y, inp.activation_min,
                                                            inp.activation_max),
    "hardswish": lambda y, inp: torch.nn.functional.hardswish(y),
}


def decomposed_conv2d(inp: Conv2dInputs) -> torch.Tensor:
    """dequantize -> fp32 conv2d -> activation -> quantize, as a PT2E graph computes it."""
    x = _DECOMPOSED.dequantize_per_tensor(inp.x, inp.input_scale, inp.input_zero_point,
                                          -128, 127, torch.int8)
    zeros = torch.zeros(inp.weights.shape[0], dtype=torch.int64)
    w = _DECOMPOSED.dequantize_per_channel(inp.weights, inp.weight_scales, zeros, 0,
                                           -127, 127, torch.int8)
    y = torch.nn.functional.conv2d(x, w, inp.bias, inp.stride, inp.padding, inp.dilation,
                                   inp.groups)
    y = _FP_ACTIVATIONS[inp.activation](y, inp)
    return _DECOMPOSED.quantize_per_tensor(y, inp.output_scale, inp.output_zero_point,
                                           -128, 127, torch.int8)


def pytorch_conv2d(inp: Conv2dInputs, per_channel: bool = True) -> torch.Tensor:
    """QNNPACK where it has the activation, else the decomposed fp32 path (hardswish)."""
    if inp.activation == "hardswish":
        return decomposed_conv2d(inp)
    return qnnpack_conv2d(inp, per_channel)


def steps_apart(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    """Asserts shape, dtype and at most one step apart; returns the exact fraction."""
    assert got.dtype == want.dtype == torch.int8, what
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    steps = (got.to(torch.int32) - want.to(torch.int32)).abs()
    assert steps.max().item() <= 1, f"{what}: {steps.max().item()} steps apart"
    return (steps == 0).double().mean().item()


def assert_bit_exact(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Asserts identical int8 results, naming how many elements differ and by how much."""
    assert got.dtype == want.dtype == torch.int8, what
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    diff = (got.to(torch.int32) - want.to(torch.int32)).abs()
    assert not diff.any(), (f"{what}: {int((diff != 0).sum())} of {diff.numel()} elements differ, "
                            f"up to {int(diff.max())} steps")


def variant_layouts() -> list[tuple[str, str, str]]:
    """(kind of `CONV_OPS`, variant, input layout): every variant of every op with every layout
    it reads (the specialised im2col reads 4W4C only; the generic one serves the others)."""
    found = []
    for kind, op_name in CONV_OPS.items():
        for info in runtime.get_op(op_name).variants:
            for layout in PACKED_LAYOUTS:
                if (info.name == "q8ta_im2col_4W4C") != (layout == "4W4C") and \
                        info.name.startswith("q8ta_im2col"):
                    continue
                found.append((kind, info.name, layout))
    return found


def residual_args(inp: Conv2dInputs, shape, seed: int, add_activation: str) -> tuple:
    """The residual arguments of a conv with output `shape` (schema order): a random int8
    residual, its qparams and the add's output qparams, scaled to the conv's output scale so
    that the sums fill the int8 range with a little saturation."""
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randint(-128, 128, tuple(shape), generator=gen, dtype=torch.int8)
    factors = (torch.rand(2, generator=gen, dtype=torch.float64) + 0.5).tolist()
    zero_points = torch.randint(-20, 21, (2,), generator=gen).tolist()
    add_zero_point = -100 if add_activation == "relu" else zero_points[1]
    return (residual, inp.output_scale * factors[0], zero_points[0], inp.output_scale * 1.5 * factors[1],
            add_zero_point, add_activation)


def random_lut(seed: int) -> torch.Tensor:
    """A random int8 ``[256]`` table whose entry for the value 0 is not 0, so that a padding
    byte sent through it would show."""
    table = torch.randint(-128, 128, (256,), generator=torch.Generator().manual_seed(seed), dtype=torch.int8)
    table[128] = 77
    return table


def packed_bytes(t) -> torch.Tensor:
    """The raw bytes of a packed device tensor, padding included."""
    data = torch.empty(4 * packed_words(t.shape, t.layout), dtype=torch.int8)
    t.memory.read(data.data_ptr(), data.numel())
    return data


def variant_args(inp: Conv2dInputs, variant: str) -> list:
    """The arguments of `inp` for `variant`: x uploaded in 4W4C for the specialised im2col
    (q8ta_im2col_4W4C reads 4W4C input only), else as they are."""
    args = list(inp.args())
    if variant == "q8ta_im2col_4W4C":
        args[0] = Tensor.from_torch(inp.x, layout="4W4C")
    return args
