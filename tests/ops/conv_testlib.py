"""What the int8 conv tests share: PyTorch's own int8 convs and comparisons in steps.

- `qnnpack_conv2d`: PyTorch's quantized conv on the QNNPACK engine, with relu
  fused and hardtanh as PyTorch's quantized hardtanh of its output;
- `decomposed_conv2d`: the fp32 path a PT2E graph spells out, dequantize ->
  conv2d -> activation -> quantize (the only PyTorch path for hardswish);
- `pytorch_conv2d`: the first for every activation it serves, else the second;
- `steps_apart`: asserts two int8 results are at most one step apart and
  returns the exact fraction.

Imported by tests/ops/test_conv2d*.py (pytest puts this folder on sys.path).
No Vulkan.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)

from runtime.tools.examples_conv2d import Conv2dInputs

MIN_EXACT = 0.995
_DECOMPOSED = torch.ops.quantized_decomposed


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
