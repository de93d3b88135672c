"""Two pointwise convs on a 1x1 map in one dispatch (the squeeze-and-excite gate's).

``q8ta_conv2d(x) -> m``, ``q8ta_conv2d(m) -> y`` (what EfficientNet's, MobileNetV3's and
RegNetY's gates make of ``global pool -> conv 1x1 -> act -> conv 1x1 -> gate``, each
activation that is no conv activation already folded in as the conv's ``lut`` by
lower_conv_lut.py) becomes one ``q8ta_conv2d_pw_pair(x, ...) -> y`` at the second conv's
place: m stays in the workgroup's shared memory, and the op gives the very bits of the two
convs (docs/int8_cnn_ops.md "Pointwise pair"). It pairs where:

- both convs read a 1x1 map ``[N, C, 1, 1]`` with a 1x1 kernel, stride 1, padding 0,
  dilation 1, groups 1 and no residual (each may have its activation and its table);
- m has the second conv as its only reader and is no program output;
- the weights, weight sums, scales and biases are constants of the program (the pair
  prepacks them), and the first conv has at most `PW_PAIR_MAX_MID_CHANNELS` output channels
  (the pair's shared memory).

A 1x1 map never reaches a spatial conv, so the convs' algorithm (chosen at load) does not
matter; the pair reads and writes any packed layout and so states none for the layout
resolver. Run by lower.py after lower_conv_lut.py, which leaves no unread node behind. Pure
graph work, no Vulkan.
"""

from __future__ import annotations

from runtime.families.conv2d import PW_PAIR_MAX_MID_CHANNELS
from runtime.programs.nodes import Const, Node, Ref
from runtime.programs.rewrite import CONV, Rewriter, bind, ints

PAIR = "etvk.q8ta_conv2d_pw_pair.default"
# The per-conv arguments of the pair's schema, in its order (conv2's with a "2" suffix).
_CONV_ARGS = ("weights", "weight_sums", "weight_scales", "bias", "activation", "activation_min",
              "activation_max", "lut")


def pair_pointwise_convs(rw: Rewriter) -> None:
    """Every conv pair the module docstring allows, as one ``q8ta_conv2d_pw_pair`` node."""
    program = rw.program
    for second in [n for n in program.nodes if n.target == CONV]:
        if second not in program.nodes:
            continue
        b2 = bind(second)
        mid = b2["x"]
        first = rw.producer(mid)
        if first is None or first.target != CONV or rw.users.get(mid.name) != [second] \
                or mid.name in program.outputs:
            continue
        b1 = bind(first)
        if not (_pointwise_on_one_pixel(rw, b1) and _pointwise_on_one_pixel(rw, b2)) \
                or rw.value_spec(b1["weights"]).shape[0] > PW_PAIR_MAX_MID_CHANNELS:
            continue
        args = (b1["x"], b1["input_scale"], b1["input_zero_point"], *(b1[a] for a in _CONV_ARGS),
                b1["output_scale"], b1["output_zero_point"], b2["input_scale"], b2["input_zero_point"],
                *(b2[a] for a in _CONV_ARGS),
                b2["output_scale"], b2["output_zero_point"])
        program.nodes.remove(first)
        del program.values[mid.name]
        rw.replace(second, Node(second.name, PAIR, args, {}, second.outputs))


def _pointwise_on_one_pixel(rw: Rewriter, b: dict) -> bool:
    """Whether a bound conv is a 1x1, stride 1, padding 0, dilation 1, groups 1 conv without
    residual of a ``[N, C, 1, 1]`` value, its per-channel values program constants."""
    x = b["x"]
    return isinstance(x, Ref) and tuple(rw.shape(x)[2:]) == (1, 1) and b["residual"] is None \
        and b["groups"] == 1 and set(ints(b["kernel_size"])) == {1} and set(ints(b["stride"])) == {1} \
        and set(ints(b["padding"])) == {0} and set(ints(b["dilation"])) == {1} \
        and all(isinstance(b[a], Const) for a in ("weights", "weight_sums", "weight_scales")) \
        and (b["bias"] is None or isinstance(b["bias"], Const))
