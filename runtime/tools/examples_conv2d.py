"""Conv2d example cases of the int8 conv family, as a table, and deterministic inputs.

Each `Conv2dCase` is a layer shape from a real network (the ``real`` field
names the original), shrunk spatially so that every case stays under about 2M
multiply-adds and runs quickly on a CPU Vulkan driver (lavapipe), plus shapes
that stress the packing: widths and channel counts that are not multiples of
4, groups whose channels straddle channel words, dilation, asymmetric
kernels, strides and paddings, and every conv activation (MobileNetV2's
ReLU6 as hardtanh(0, 6), MobileNetV3's hardswish). `make_inputs` builds the
arguments of ``etvk.q8ta_conv2d`` in schema order, `make_pw_pair` those of
``etvk.q8ta_conv2d_pw_pair`` (EfficientNet-B0's gate shapes: `SE_PAIRS`). Used by the conv tests
(tests/ops), the demo (through runtime/examples.py) and the conv benchmark.
Pure torch; no Vulkan.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from runtime.families.conv2d import Conv2dParams, conv2d_params, weight_sums


@dataclass(frozen=True)
class Conv2dCase:
    """One conv layer: input [N, C_in, H, W], weights [C_out, C_in/groups, *kernel].

    ``activation_min`` and ``activation_max`` are hardtanh's bounds (ignored
    by the other activations).
    """

    name: str
    N: int
    C_in: int
    H: int
    W: int
    C_out: int
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)
    groups: int = 1
    activation: str = "none"
    bias: bool = True
    real: str = ""
    activation_min: float = 0.0
    activation_max: float = 6.0

    @property
    def params(self) -> Conv2dParams:
        """The case's geometry."""
        return conv2d_params((self.N, self.C_in, self.H, self.W),
                             (self.C_out, self.C_in // self.groups, *self.kernel),
                             list(self.kernel), list(self.stride), list(self.padding),
                             list(self.dilation), self.groups)

    @property
    def macs(self) -> int:
        """Multiply-adds of the conv."""
        p = self.params
        return p.N * p.C_out * p.H_out * p.W_out * p.Kg


C = Conv2dCase
CASES = [
    C("mobilenetv3_stem_3x3s2", 1, 3, 24, 24, 16, (3, 3), (2, 2), (1, 1), activation="hardswish",
      real="MobileNetV3-Large stem: 3->16, 224x224, 3x3 stride 2, hardswish"),
    C("resnet50_stem_7x7s2", 1, 3, 24, 24, 64, (7, 7), (2, 2), (3, 3), activation="relu",
      real="ResNet-50 conv1: 3->64, 224x224, 7x7 stride 2 pad 3"),
    C("resnet_bottleneck_1x1_reduce", 1, 256, 8, 8, 64, (1, 1), activation="relu",
      real="ResNet-50 layer1 conv1: 256->64, 56x56"),
    C("resnet_bottleneck_3x3", 1, 64, 7, 7, 64, (3, 3), padding=(1, 1), activation="relu",
      real="ResNet-50 layer1 conv2: 64->64, 56x56, 3x3 pad 1"),
    C("resnet_bottleneck_1x1_expand", 1, 64, 7, 7, 256, (1, 1),
      real="ResNet-50 layer1 conv3: 64->256, 56x56, no relu before the add"),
    C("resnet_downsample_1x1s2", 1, 64, 14, 14, 128, (1, 1), (2, 2), bias=False,
      real="ResNet-50 layer2 downsample: 256->512, 56x56, 1x1 stride 2"),
    C("mobilenetv2_expand_1x1", 1, 24, 14, 14, 144, (1, 1), activation="hardtanh",
      real="MobileNetV2 block 3 expand: 24->144, 56x56, relu6"),
    C("mobilenetv2_dw_3x3s1", 1, 144, 14, 14, 144, (3, 3), padding=(1, 1), groups=144,
      activation="hardtanh", real="MobileNetV2 block 3 depthwise: 144, 56x56, stride 1, relu6"),
    C("mobilenetv2_dw_3x3s2_odd", 1, 144, 15, 15, 144, (3, 3), (2, 2), (1, 1), groups=144,
      activation="hardtanh",
      real="MobileNetV2 block 4 depthwise: 144, 56x56 -> 28x28, stride 2, relu6"),
    C("mobilenetv3_expand_1x1", 1, 80, 7, 7, 240, (1, 1), activation="hardswish",
      real="MobileNetV3-Large block 7 expand: 80->240, 14x14, hardswish"),
    C("mobilenetv3_dw_5x5s2", 1, 72, 11, 11, 72, (5, 5), (2, 2), (2, 2), groups=72,
      activation="hardswish",
      real="MobileNetV3-Large block 12 depthwise: 672, 14x14 -> 7x7, 5x5 stride 2, hardswish"),
    C("mobilenetv2_dw_c30_w13", 1, 30, 5, 13, 30, (3, 3), padding=(1, 1), groups=30, bias=False,
      real="depthwise with C and W not multiples of 4"),
    C("mobilenetv2_project_1x1", 1, 144, 14, 14, 24, (1, 1),
      real="MobileNetV2 block 3 project: 144->24, 56x56, linear"),
    C("grouped_g2_cg8", 1, 16, 10, 10, 16, (3, 3), padding=(1, 1), groups=2, activation="relu",
      real="ResNeXt-style grouped 3x3, 2 groups of 8 channels"),
    C("grouped_g4_cg4_cout32", 1, 16, 9, 11, 32, (3, 3), padding=(1, 1), groups=4,
      real="grouped 3x3, 4 groups of 4 channels, 8 outputs each"),
    C("grouped_g2_cg6_cout10", 1, 12, 6, 7, 10, (3, 3), padding=(1, 1), groups=2, bias=False,
      real="groups whose channels straddle a channel word (Cg % 4 != 0)"),
    C("grouped_g3_cg5_cout9", 2, 15, 5, 6, 9, (3, 3), padding=(1, 1), groups=3, activation="relu",
      real="3 groups of 5 channels, 3 outputs each, batch 2"),
    C("pointwise_grouped_g2_cg8", 1, 16, 6, 7, 24, (1, 1), groups=2,
      real="ShuffleNet-style grouped 1x1"),
    C("pointwise_cin6_cout7", 1, 6, 5, 9, 7, (1, 1), activation="relu",
      real="1x1 with C_in and C_out not multiples of 4"),
    C("dilated_3x3_d2", 1, 16, 12, 12, 16, (3, 3), padding=(2, 2), dilation=(2, 2),
      activation="relu", real="DeepLabV3 atrous 3x3, dilation 2"),
    C("strided_3x3s2_w13_cout12", 1, 8, 9, 13, 12, (3, 3), (2, 2), (1, 1),
      real="stride-2 3x3 on an odd 9x13 input"),
    C("batch2_3x3_cout10", 2, 8, 6, 6, 10, (3, 3), padding=(1, 1), activation="relu",
      real="batch 2, C_out not a multiple of 4"),
    C("rgb_3x3_w7_cout5", 1, 3, 5, 7, 5, (3, 3), bias=False,
      real="3-channel input, no padding, W=7, C_out=5"),
    C("asym_1x7_pad_0_3", 1, 8, 6, 13, 8, (1, 7), padding=(0, 3),
      real="Inception-v3 factorised 1x7"),
    C("asym_3x5_s1x2_pad2x1", 1, 8, 7, 11, 12, (3, 5), (1, 2), (2, 1), (2, 1), activation="relu",
      real="mixed strides, paddings and dilations per axis"),
    C("wide_c4_70x70", 1, 4, 70, 70, 8, (3, 3), padding=(1, 1),
      real="few channels, 4900 output pixels: above the im2col pixel limit"),
    C("large_pad_5x5_pad4", 1, 4, 6, 5, 4, (5, 5), padding=(4, 4), bias=False,
      real="padding larger than half the kernel: outputs that see mostly padding"),
    C("hardtanh_3x3_m1p5_2", 1, 8, 7, 9, 12, (3, 3), padding=(1, 1), activation="hardtanh",
      activation_min=-1.5, activation_max=2.0,
      real="hardtanh with a negative lower bound, C_out not a multiple of 8"),
    C("alexnet_stem_11x11s4", 1, 3, 27, 27, 16, (11, 11), (4, 4), (2, 2), activation="relu",
      real="AlexNet conv1: 3->64, 224x224, 11x11 stride 4 pad 2 (a kernel above 7x7: the direct "
           "conv's loop bounds from push constants)"),
    C("dw_9x9", 1, 8, 12, 12, 8, (9, 9), padding=(4, 4), groups=8,
      real="a depthwise kernel above 7x7: the tap loops' bounds from push constants"),
]
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclass(frozen=True)
class Conv2dInputs:
    """Arguments of ``etvk.q8ta_conv2d`` (OPS.md family 2), in schema order."""

    x: torch.Tensor
    input_scale: float
    input_zero_point: int
    weights: torch.Tensor
    weight_sums: torch.Tensor
    weight_scales: torch.Tensor
    output_scale: float
    output_zero_point: int
    bias: torch.Tensor | None
    kernel_size: list[int]
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    activation: str
    activation_min: float
    activation_max: float

    def args(self) -> tuple:
        """The arguments as a tuple, in schema order."""
        return tuple(getattr(self, name) for name in self.__dataclass_fields__)


def _uniform(gen: torch.Generator, lo: float, hi: float, shape=()) -> torch.Tensor:
    return torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo) + lo


def make_inputs(case: Conv2dCase, seed: int | None = None,
                per_tensor_weights: bool = False) -> Conv2dInputs:
    """Deterministic random arguments for ``case``.

    x is int8 over the whole range, weights are int8 in [-127, 127] (symmetric),
    weight scales ~ U(0.001, 0.01) per output channel (all equal with
    ``per_tensor_weights``), bias ~ N(0, spread of y / 2) or None. The output
    scale is chosen from the spread of y so that outputs fill the int8 range
    with a little saturation; relu and hardswish cases use a low output zero
    point, as a real network's activations after them do; hardtanh cases map
    [activation_min, activation_max] onto 220 steps inside the int8 range.

    Args:
        case: the conv.
        seed: the generator seed; by default a hash of the case name.
        per_tensor_weights: one weight scale for every output channel.
    """
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) if seed is None else seed)
    p = case.params
    x = torch.randint(-128, 128, (p.N, p.C_in, p.H, p.W), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (p.C_out, p.Cg, p.KH, p.KW), generator=gen, dtype=torch.int8)
    if per_tensor_weights:
        scales = _uniform(gen, 0.001, 0.01).expand(p.C_out)
    else:
        scales = _uniform(gen, 0.001, 0.01, (p.C_out,))
    weight_scales = scales.to(torch.float32)
    input_scale = float(_uniform(gen, 0.01, 0.05))
    input_zero_point = int(torch.randint(-20, 21, (), generator=gen))
    # y's spread: x - izp and w are roughly uniform (standard deviations ~74 and ~73).
    sigma = input_scale * weight_scales.double().square().mean().sqrt().item() * 74 * 73
    sigma *= math.sqrt(p.Kg)
    bias = None
    if case.bias:
        bias = (torch.randn(p.C_out, generator=gen, dtype=torch.float64) * sigma / 2).to(torch.float32)
    if case.activation == "relu":
        output_scale = 3.2 * sigma / 255
        output_zero_point = int(torch.randint(-128, -100, (), generator=gen))
    elif case.activation == "hardswish":  # outputs >= -0.375
        output_scale = 3.2 * sigma / 255
        output_zero_point = int(torch.randint(-110, -100, (), generator=gen))
    elif case.activation == "hardtanh":
        output_scale = (case.activation_max - case.activation_min) / 220
        low = int(torch.randint(-120, -100, (), generator=gen))
        output_zero_point = low - round(case.activation_min / output_scale)
    else:
        output_scale = 6.4 * sigma / 255
        output_zero_point = int(torch.randint(-10, 11, (), generator=gen))
    return Conv2dInputs(
        x=x, input_scale=input_scale, input_zero_point=input_zero_point, weights=w,
        weight_sums=weight_sums(w), weight_scales=weight_scales, output_scale=output_scale,
        output_zero_point=output_zero_point, bias=bias, kernel_size=list(case.kernel),
        stride=list(case.stride), padding=list(case.padding), dilation=list(case.dilation),
        groups=case.groups, activation=case.activation, activation_min=case.activation_min,
        activation_max=case.activation_max,
    )


# EfficientNet-B0's 16 squeeze-and-excite gates, (C, C_mid) each: the expanded channels and the
# block input's / 4 (its q8ta_conv2d_pw_pair shapes, in network order).
SE_PAIRS = [(32, 8), (96, 4), (144, 6), (144, 6), (240, 10), (240, 10), *[(480, 20)] * 3,
            *[(672, 28)] * 3, *[(1152, 48)] * 4]


def _pair_conv(gen: torch.Generator, c_in: int, c_out: int, bias: bool, activation: str,
               lut: bool) -> dict:
    weights = torch.randint(-127, 128, (c_out, c_in, 1, 1), generator=gen, dtype=torch.int8)
    table = torch.randint(-128, 128, (256,), generator=gen, dtype=torch.int8) if lut else None
    if table is not None:
        table[128] = 77  # the entry of 0 not 0: a padding byte sent through the table would show
    return {"weights": weights, "weight_sums": weight_sums(weights),
            "weight_scales": _uniform(gen, 0.001, 0.021, (c_out,)).to(torch.float32),
            "bias": torch.randn(c_out, generator=gen) if bias else None,
            "activation": activation, "activation_min": -1.0, "activation_max": 2.5, "lut": table}


def make_pw_pair(c_in: int, c_mid: int, c_out: int, n: int, seed: int, bias=(True, False),
                 activations=("relu", "none"), luts=(False, False)) -> tuple[torch.Tensor, dict]:
    """(x int8 ``[n, c_in, 1, 1]``, the other arguments of ``etvk.q8ta_conv2d_pw_pair`` by
    name): random weights, per-channel scales, qparams that keep both convs' outputs off
    saturation, a bias, activation and random table (``luts``) per conv as given."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (n, c_in, 1, 1), generator=gen, dtype=torch.int8)
    first = _pair_conv(gen, c_in, c_mid, bias[0], activations[0], luts[0])
    second = _pair_conv(gen, c_mid, c_out, bias[1], activations[1], luts[1])
    second = {name.replace("activation", "activation2") if name.startswith("activation") else f"{name}2": v
              for name, v in second.items()}
    return x, {"input_scale": 0.05, "input_zero_point": -3, **first,
               "mid_scale": 0.9 + c_in / 64, "mid_zero_point": 5, "input_scale2": 0.03 + c_mid / 500,
               "input_zero_point2": -11, **second, "output_scale": 0.7 + c_mid / 8,
               "output_zero_point": -9}


def pw_pair_convs(args: dict) -> tuple[dict, dict]:
    """The keyword arguments (after x) of the two ``etvk.q8ta_conv2d`` calls that
    ``etvk.q8ta_conv2d_pw_pair`` with `args` (its arguments after x by name) equals."""
    def conv(suffix: str, input_qparams: tuple, output_qparams: tuple) -> dict:
        activation = f"activation{suffix}"
        return {"input_scale": input_qparams[0], "input_zero_point": input_qparams[1],
                "weights": args[f"weights{suffix}"], "weight_sums": args[f"weight_sums{suffix}"],
                "weight_scales": args[f"weight_scales{suffix}"], "output_scale": output_qparams[0],
                "output_zero_point": output_qparams[1], "bias": args[f"bias{suffix}"],
                "kernel_size": [1, 1], "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1],
                "groups": 1, "activation": args[activation], "activation_min": args[f"{activation}_min"],
                "activation_max": args[f"{activation}_max"], "lut": args[f"lut{suffix}"]}
    return (conv("", (args["input_scale"], args["input_zero_point"]), (args["mid_scale"], args["mid_zero_point"])),
            conv("2", (args["input_scale2"], args["input_zero_point2"]),
                 (args["output_scale"], args["output_zero_point"])))
