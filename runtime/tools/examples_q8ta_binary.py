"""Example cases of the q8ta_binary family (int8 add, mul, concat), as tables, and inputs.

Each case is a shape and qparams from a real network (the ``real`` field
names the original, shrunk spatially so that it runs quickly on a CPU Vulkan
driver) or one that stresses the packing and the numerics: channel counts and
widths that are not multiples of 4, a concat whose first input ends inside a
channel word, qparams whose products land on rounding ties, outputs that
saturate, inputs that share the output's qparams. `binary_inputs`,
`concat_inputs` and `concat_channel_lut_inputs` (a concat case and a table
per channel, optionally after window sums and their tables) build the
arguments in schema order. Used by the tests
(tests/ops) and, through runtime/tools/examples.py, the demo. Pure torch; no
Vulkan.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from runtime.tools.examples_q8ta_unary import window_sums_inputs


@dataclass(frozen=True)
class QParams:
    """Per-tensor int8 quantization parameters."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class BinaryCase:
    """One add or mul: a [N, C, H, W], b of a's shape or [N, C, 1, 1]."""

    name: str
    op: str  # "add" or "mul"
    a_shape: tuple[int, int, int, int]
    a: QParams
    b: QParams
    out: QParams
    broadcast: bool = False
    activation: str = "none"
    real: str = ""

    @property
    def b_shape(self) -> tuple[int, int, int, int]:
        n, c, h, w = self.a_shape
        return (n, c, 1, 1) if self.broadcast else (n, c, h, w)


@dataclass(frozen=True)
class ConcatCase:
    """One channel concat of a [N, C_a, H, W] and b [N, C_b, H, W]."""

    name: str
    N: int
    C_a: int
    C_b: int
    H: int
    W: int
    a: QParams
    b: QParams
    out: QParams
    real: str = ""


Q = QParams
B = BinaryCase
BINARY_CASES = [
    B("resnet_residual_add_relu", "add", (1, 32, 7, 7), Q(0.0314, -3), Q(0.0271, 12), Q(0.0427, -128),
      activation="relu", real="ResNet-50 bottleneck output: conv3 + identity, then relu"),
    B("mobilenetv2_residual_add", "add", (1, 24, 6, 6), Q(0.0873, 5), Q(0.0651, -9), Q(0.1107, 2),
      real="MobileNetV2 inverted residual: project + identity, no relu"),
    B("add_c6_w5_batch2", "add", (2, 6, 3, 5), Q(0.05, 3), Q(0.03, -7), Q(0.07, -5),
      real="C and W not multiples of 4, batch 2"),
    B("add_ties_odd_zero_point", "add", (1, 8, 4, 8), Q(0.5, 1), Q(0.25, -2), Q(1.0, 3),
      real="y * 1/output_scale lands on .5 for a quarter of the pairs"),
    B("add_saturating_relu", "add", (1, 5, 3, 3), Q(0.2, -20), Q(0.3, 40), Q(0.01, 7),
      activation="relu", real="most outputs clamp at -128 or 127"),
    B("add_broadcast_c13", "add", (2, 13, 3, 7), Q(0.04, 0), Q(0.09, -17), Q(0.08, 1), broadcast=True,
      real="a per-channel bias map [N, C, 1, 1], C = 13"),
    B("se_gate_mul", "mul", (1, 24, 5, 6), Q(0.0412, -4), Q(1 / 256, -128), Q(0.0398, -6),
      broadcast=True, real="squeeze-and-excite (MobileNetV3, EfficientNet): x * sigmoid gate"),
    B("se_gate_mul_c10_w3", "mul", (2, 10, 2, 3), Q(0.0917, 11), Q(1 / 256, -128), Q(0.05, 0),
      broadcast=True, activation="relu", real="gate with C and W not multiples of 4, relu"),
    B("mul_same_shape_relu", "mul", (1, 10, 4, 9), Q(0.021, 7), Q(0.033, -11), Q(0.0213, -100),
      activation="relu", real="elementwise product of two feature maps, relu"),
    B("mul_ties", "mul", (1, 7, 3, 4), Q(0.5, 0), Q(0.5, 1), Q(2.0, -1),
      real="(ra * rb) * 0.5 is an exact multiple of 1/8: ties for a quarter of the pairs"),
]

C = ConcatCase
CONCAT_CASES = [
    C("inception_concat_c8_c12", 1, 8, 12, 5, 5, Q(0.0311, -7), Q(0.0293, 4), Q(0.0311, -7),
      real="Inception branch concat, a already in the output's qparams (copied exactly)"),
    C("densenet_concat_c6_c4", 1, 6, 4, 4, 6, Q(0.051, 9), Q(0.0432, -2), Q(0.0617, 0),
      real="DenseNet layer concat, C_a % 4 == 2"),
    C("concat_c5_c7", 1, 5, 7, 3, 5, Q(0.02, -128), Q(0.07, 100), Q(0.05, -3),
      real="C_a % 4 == 1, C_b % 4 == 3, saturating b"),
    C("concat_c7_c6_batch2", 2, 7, 6, 2, 3, Q(0.5, 1), Q(0.25, -1), Q(1.0, 0),
      real="C_a % 4 == 3, batch 2, odd width, ties"),
    C("concat_c3_c1", 1, 3, 1, 2, 9, Q(0.1, 0), Q(0.2, 5), Q(0.15, -9),
      real="output of 4 channels from a straddling word"),
    C("concat_same_qparams_c5_c6", 1, 5, 6, 3, 4, Q(0.0625, -3), Q(0.0625, -3), Q(0.0625, -3),
      real="both inputs in the output's qparams: an exact copy"),
    C("concat_c1_c2", 2, 1, 2, 3, 2, Q(0.3, 2), Q(0.1, -50), Q(0.3, 2),
      real="single channels, a copied exactly"),
    C("concat_c16_c13_w4", 2, 16, 13, 2, 4, Q(0.04, 3), Q(0.09, -20), Q(0.06, 1),
      real="16-byte quads in every layout (4C: C_a % 16 == 0, 4 channel words of b), padding channels"),
    C("concat_c6_c10_w8", 1, 6, 10, 2, 8, Q(0.03, -5), Q(0.045, 7), Q(0.05, 0),
      real="16-byte quads in 4C1W with b shifted by 2 channels, two quads a row"),
    C("densenet_concat_c24_c8_batch2", 2, 24, 8, 3, 5, Q(0.047, -6), Q(0.052, 3), Q(0.05, -2),
      real="8 channel words (tables read in tiles of 4 words in 4C), 30 pixels: a partial row of 6"),
    C("densenet_concat_c32_c16_batch2", 2, 32, 16, 3, 5, Q(0.05, 0), Q(0.05, 0), Q(0.05, 0),
      real="4C quads of a and b lined up (runs of 4 pixels with tables of maps), 30 pixels: a last run of 2"),
]
BINARY_BY_NAME = {case.name: case for case in BINARY_CASES}
CONCAT_BY_NAME = {case.name: case for case in CONCAT_CASES}


def _int8(gen: torch.Generator, shape) -> torch.Tensor:
    """Uniform int8 over the whole range, with the extremes at the first two values."""
    x = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    flat = x.view(-1)
    flat[: min(2, flat.numel())] = torch.tensor([-128, 127], dtype=torch.int8)[: min(2, flat.numel())]
    return x


def _generator(name: str, seed: int | None) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) if seed is None else seed)


def binary_inputs(case: BinaryCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_add`` / ``etvk.q8ta_mul`` for ``case``, in schema order."""
    gen = _generator(case.name, seed)
    a, b = _int8(gen, case.a_shape), _int8(gen, case.b_shape)
    return (a, case.a.scale, case.a.zero_point, b, case.b.scale, case.b.zero_point,
            case.out.scale, case.out.zero_point, case.activation)


def concat_inputs(case: ConcatCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_concat`` for ``case``, in schema order."""
    gen = _generator(case.name, seed)
    a = _int8(gen, (case.N, case.C_a, case.H, case.W))
    b = _int8(gen, (case.N, case.C_b, case.H, case.W))
    return (a, case.a.scale, case.a.zero_point, b, case.b.scale, case.b.zero_point,
            case.out.scale, case.out.zero_point)


def concat_channel_lut_inputs(case: ConcatCase, seed: int | None = None, raw: bool = False,
                              sums_channels: int = 0, taps: int = 4) -> tuple:
    """Arguments of ``etvk.q8ta_concat_channel_lut`` for ``case``, in schema order: those of
    `concat_inputs` (every scale 1 and zero point 0 where `raw`: the lowering's byte copy), then
    a random int8 ``[C_a + C_b, 256]`` table; with `sums_channels` Cs > 0 then window sums
    ``[N, Cs, H, W]`` of `taps` values and their int8 table (`window_sums_inputs`)."""
    args = list(concat_inputs(case, seed))
    if raw:
        args[1:3], args[4:8] = (1.0, 0), (1.0, 0, 1.0, 0)
    gen = _generator(case.name + "/table", seed)
    args.append(_int8(gen, (case.C_a + case.C_b, 256)))
    if sums_channels:
        args.extend(window_sums_inputs(gen, (case.N, sums_channels, case.H, case.W), taps, torch.int8))
    return tuple(args)


def build(op_name: str):
    """A builder for ``runtime.tools.examples.EXAMPLES``: the case of the op's table at
    index (the shape's last size mod the table's length), so a shape picks a case."""
    if op_name == "etvk.q8ta_concat.default":
        cases, make = CONCAT_CASES, concat_inputs
    elif op_name == "etvk.q8ta_concat_channel_lut.default":
        cases, make = CONCAT_CASES, concat_channel_lut_inputs
    else:
        kind = op_name.split(".")[1].removeprefix("q8ta_")
        cases, make = [c for c in BINARY_CASES if c.op == kind], binary_inputs

    def builder(axes, shape, gen):
        case = cases[(shape[-1] if shape else 0) % len(cases)]
        return make(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}

    return builder
