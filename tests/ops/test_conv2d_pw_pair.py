"""q8ta_conv2d_pw_pair: two 1x1 convs on a 1x1 map in one dispatch (the squeeze-and-excite gate).

- the reference is q8ta_conv2d twice;
- every variant (DOT) and layout, channel counts that are and are not multiples of 4 (an output
  word split over K slices, and more output words than invocations), N 1 and 3, with and without
  biases, relu / hardtanh / hardswish, a table on either conv: bit-exact against the reference
  and, padding bytes included, against two q8ta_conv2d calls on the device;
- bad arguments name the op and the argument.
"""

from __future__ import annotations

import pytest
import torch
from conv_testlib import assert_bit_exact, packed_bytes, random_lut

import runtime
from runtime.families.conv2d import weight_sums
from runtime.reference import conv2d as ref
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_conv2d_pw_pair.default"
CONV = "etvk.q8ta_conv2d.default"

# (C_in, C_mid, C_out, N): EfficientNet-B0's first gate (32 -> 8 -> 32), channels not multiples
# of 4, a wide input (K split over many slices), more output words than a workgroup's invocations.
SHAPES = [(32, 8, 32, 1), (30, 7, 13, 3), (1152, 48, 1152, 1), (10, 5, 1030, 3)]


def _conv_args(generator, c_in: int, c_out: int, bias: bool, activation: str, lut) -> dict:
    weights = torch.randint(-127, 128, (c_out, c_in, 1, 1), generator=generator, dtype=torch.int8)
    return {"weights": weights, "weight_sums": weight_sums(weights),
            "weight_scales": torch.rand(c_out, generator=generator) * 0.02 + 0.001,
            "bias": torch.randn(c_out, generator=generator) if bias else None,
            "activation": activation, "activation_min": -1.0, "activation_max": 2.5, "lut": lut}


def make_pair(shape, seed: int, bias=(True, False), activations=("relu", "none"), luts=(None, None)):
    """(x, the pair op's arguments after x by name)."""
    c_in, c_mid, c_out, n = shape
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (n, c_in, 1, 1), generator=generator, dtype=torch.int8)
    first = _conv_args(generator, c_in, c_mid, bias[0], activations[0], luts[0])
    second = _conv_args(generator, c_mid, c_out, bias[1], activations[1], luts[1])
    args = {"input_scale": 0.05, "input_zero_point": -3, **first,
            "mid_scale": 0.9 + c_in / 64, "mid_zero_point": 5, "input_scale2": 0.03 + c_mid / 500,
            "input_zero_point2": -11,
            **{f"{name}2" if not name.startswith("activation") else name.replace("activation", "activation2"): v
               for name, v in second.items()},
            "output_scale": 0.7 + c_mid / 8, "output_zero_point": -9}
    return x, args


def _convs(args: dict) -> tuple[dict, dict]:
    """The two q8ta_conv2d calls' keyword arguments (after x) of the pair's arguments."""
    def conv(suffix, scale, zero_point, out_scale, out_zero_point):
        activation = f"activation{suffix}"
        return {"input_scale": scale, "input_zero_point": zero_point, "weights": args[f"weights{suffix}"],
                "weight_sums": args[f"weight_sums{suffix}"], "weight_scales": args[f"weight_scales{suffix}"],
                "output_scale": out_scale, "output_zero_point": out_zero_point, "bias": args[f"bias{suffix}"],
                "kernel_size": [1, 1], "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                "activation": args[activation], "activation_min": args[f"{activation}_min"],
                "activation_max": args[f"{activation}_max"], "lut": args[f"lut{suffix}"]}
    return (conv("", args["input_scale"], args["input_zero_point"], args["mid_scale"], args["mid_zero_point"]),
            conv("2", args["input_scale2"], args["input_zero_point2"], args["output_scale"], args["output_zero_point"]))


def test_reference_is_two_convs():
    x, args = make_pair((30, 7, 13, 3), 1, luts=(random_lut(1), None))
    first, second = _convs(args)
    want = ref.q8ta_conv2d(ref.q8ta_conv2d(x, **first), **second)
    assert_bit_exact(ref.q8ta_conv2d_pw_pair(x, **args), want, "reference")


CASES = [
    pytest.param({}, id="relu-none"),
    pytest.param({"bias": (False, True), "activations": ("none", "relu")}, id="bias2-relu2"),
    pytest.param({"activations": ("hardswish", "hardtanh")}, id="hardswish-hardtanh"),
    pytest.param({"luts": "first", "activations": ("none", "none")}, id="lut1"),
    pytest.param({"luts": "second", "bias": (True, True)}, id="lut2"),
    pytest.param({"luts": "both", "bias": (False, False)}, id="lut-both"),
]


def _variants():
    return [info.name for info in runtime.get_op(OP).variants]


@pytest.mark.parametrize("variant", _variants())
@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{a}-{b}-{c}-n{n}" for a, b, c, n in SHAPES])
@pytest.mark.parametrize("options", CASES)
def test_pair_matches_two_convs_bit_exact(options, shape, layout, variant, dispatch_trace):
    """One dispatch gives the reference's values and the bytes of two q8ta_conv2d calls."""
    options = dict(options)
    which = options.pop("luts", None)
    luts = {None: (None, None), "first": (random_lut(2), None), "second": (None, random_lut(3)),
            "both": (random_lut(4), random_lut(5))}[which]
    x, args = make_pair(shape, sum(shape), luts=luts, **options)
    want = ref.q8ta_conv2d_pw_pair(x, **args)
    first, second = _convs(args)
    what = f"{variant} {layout} {shape} {options} {which}"
    with Stream() as stream:
        device_x = Tensor.from_torch(x, layout=layout)
        pair = runtime.get_op(OP).record(stream, device_x, **args, variant=variant)
        conv = runtime.get_op(CONV)
        two = conv.record(stream, conv.record(stream, device_x, **first), **second)
        stream.run()
        assert pair.layout == two.layout == layout, what
        assert_bit_exact(pair.to_torch(), want, what)
        assert torch.equal(packed_bytes(pair), packed_bytes(two)), f"{what}: two convs"
    assert variant in dispatch_trace(), f"{variant} never reached the device"


def test_host_input_runs():
    x, args = make_pair((30, 7, 13, 3), 6)
    assert_bit_exact(runtime.get_op(OP)(x, **args), ref.q8ta_conv2d_pw_pair(x, **args), "host x")


BAD = [
    ("x", lambda x, a: (torch.zeros(1, 32, 2, 1, dtype=torch.int8), a), "a 1x1 map"),
    ("weights", lambda x, a: (x, {**a, "weights": a["weights"][:, :5]}), "C_in=32"),
    ("weights2", lambda x, a: (x, {**a, "weights2": a["weights2"][:, :5]}), "C_mid=8"),
    ("weight_sums2", lambda x, a: (x, {**a, "weight_sums2": a["weight_sums2"][:3]}), "one int32 value"),
    ("weight_scales2", lambda x, a: (x, {**a, "weight_scales2": -a["weight_scales2"]}), "finite fp32"),
    ("bias2", lambda x, a: (x, {**a, "bias2": torch.zeros(3)}), "one float value"),
    ("mid_scale", lambda x, a: (x, {**a, "mid_scale": 0.0}), "finite number > 0"),
    ("mid_zero_point", lambda x, a: (x, {**a, "mid_zero_point": 128}), "within int8"),
    ("input_scale2", lambda x, a: (x, {**a, "input_scale2": float("nan")}), "finite number > 0"),
    ("input_zero_point2", lambda x, a: (x, {**a, "input_zero_point2": -129}), "within int8"),
    ("activation2", lambda x, a: (x, {**a, "activation2": "gelu"}), "must be one of"),
    ("activation2_max", lambda x, a: (x, {**a, "activation2": "hardtanh", "activation2_max": -5.0}), ">= activation2_min"),
    ("lut2", lambda x, a: (x, {**a, "lut2": torch.zeros(255, dtype=torch.int8)}), "int8 [256]"),
    ("weight_sums", lambda x, a: (x, {**a, "weight_scales2": Tensor.from_torch(a["weight_scales2"])}), "host (torch)"),
]


@pytest.mark.parametrize(("arg", "change", "text"), BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_name_the_op_and_argument(arg, change, text):
    x, args = change(*make_pair((32, 8, 32, 1), 7))
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(OP)(x, **args)
    message = str(info.value)
    assert message.startswith(f"{OP}: argument '{arg}'"), message
    assert text in message, message
