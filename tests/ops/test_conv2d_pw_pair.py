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
from conv_testlib import assert_bit_exact, packed_bytes

import runtime
from runtime.families.conv2d import PW_PAIR_MAX_MID_CHANNELS
from runtime.reference import conv2d as ref
from runtime.tools.examples_conv2d import make_pw_pair, pw_pair_convs
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

OP = "etvk.q8ta_conv2d_pw_pair.default"
CONV = "etvk.q8ta_conv2d.default"

# (C_in, C_mid, C_out, N): EfficientNet-B0's first gate (32 -> 8 -> 32), channels not multiples
# of 4, a wide input (K split over many slices), more output words than a workgroup's invocations.
SHAPES = [(32, 8, 32, 1), (30, 7, 13, 3), (1152, 48, 1152, 1), (10, 5, 1030, 3)]


def make_pair(shape, seed: int, bias=(True, False), activations=("relu", "none"), luts=(False, False)):
    """(x, the pair op's arguments after x by name) of a (C_in, C_mid, C_out, N) shape."""
    return make_pw_pair(*shape, seed, bias=bias, activations=activations, luts=luts)


def test_reference_is_two_convs():
    x, args = make_pair((30, 7, 13, 3), 1, luts=(True, False))
    first, second = pw_pair_convs(args)
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
    luts = {None: (False, False), "first": (True, False), "second": (False, True), "both": (True, True)}[which]
    x, args = make_pair(shape, sum(shape), luts=luts, **options)
    want = ref.q8ta_conv2d_pw_pair(x, **args)
    first, second = pw_pair_convs(args)
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
    ("weight_scales2", lambda x, a: (x, {**a, "weight_scales2": Tensor.from_torch(a["weight_scales2"])}), "host (torch)"),
    ("bias", lambda x, a: (x, {**a, "bias": Tensor.from_torch(a["bias"])}), "host (torch)"),
    ("weights", lambda x, a: make_pair((8, PW_PAIR_MAX_MID_CHANNELS + 1, 8, 1), 7), "at most 4096"),
]


@pytest.mark.parametrize(("arg", "change", "text"), BAD, ids=[f"{b[0]}-{b[2]}" for b in BAD])
def test_bad_arguments_name_the_op_and_argument(arg, change, text):
    x, args = change(*make_pair((32, 8, 32, 1), 7))
    with pytest.raises((ValueError, TypeError)) as info:
        runtime.get_op(OP)(x, **args)
    message = str(info.value)
    assert message.startswith(f"{OP}: argument '{arg}'"), message
    assert text in message, message
