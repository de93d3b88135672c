"""Pooling example cases of the int8 pooling family (q8ta_pool), as tables, and their arguments.

`WINDOW_CASES` are windowed poolings: real layers (the ``real`` field names
the original), shrunk in channels or size to run quickly on a CPU Vulkan
driver, plus shapes that stress PyTorch's rules: ceil_mode windows (the last
one cut at size + padding, or dropped when it would start in the right
padding), padding up to half the kernel, asymmetric kernels and strides, an
empty stride, dilation (max only), count_include_pad, divisor_override
(negative too) and a window that sees only padding; those whose windows are
all full also serve the window sum. `GLOBAL_CASES` are global
average poolings, at the real sizes of ResNet-50, MobileNetV2 and
EfficientNet-B0's first gate and on maps whose sums need several workers. `ADAPTIVE_CASES` are adaptive average poolings to VGG's and
AlexNet's heads and to sizes that do not divide the input or exceed it. The
argument builders give each op's arguments in schema order.
Used by the pool tests (tests/ops), the demo (through runtime/tools/examples.py)
and the benchmarks. Pure torch; no Vulkan.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from runtime.families.pool2d import Pool2dParams, pool2d_params


@dataclass(frozen=True)
class WindowCase:
    """One windowed pooling of an int8 ``[N, C, H, W]`` input.

    ``output_ratio`` is output_scale / input_scale of the average pool (small
    ratios saturate). Cases with a dilation other than 1 are max pools only.
    """

    name: str
    N: int
    C: int
    H: int
    W: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = (0,)
    dilation: tuple[int, ...] = (1,)
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None
    output_ratio: float = 1.0
    real: str = ""

    @property
    def params(self) -> Pool2dParams:
        """The case's geometry."""
        return pool2d_params((self.N, self.C, self.H, self.W), list(self.kernel), list(self.stride),
                             list(self.padding), list(self.dilation), self.ceil_mode)

    @property
    def full_windows(self) -> bool:
        """Whether every window lies inside the image (no padding, no ceil_mode window, dilation
        1): the cases ``q8ta_window_sum`` takes."""
        params = self.params
        return params.padding == (0, 0) and params.dilation == (1, 1) and not self.ceil_mode

    @property
    def is_avg(self) -> bool:
        """Whether avg_pool2d (which has no dilation) takes the case."""
        return self.params.dilation == (1, 1)


W = WindowCase
WINDOW_CASES = [
    W("resnet_stem_3x3s2p1", 1, 16, 28, 28, (3, 3), (2, 2), (1, 1),
      real="ResNet-50 stem max pool: 64 channels, 112x112, 3x3 stride 2 pad 1"),
    W("ceil_3x3s2_odd_9x13", 1, 6, 9, 13, (3,), (2,), ceil_mode=True,
      real="GoogLeNet / SqueezeNet ceil_mode pools on odd sizes"),
    W("ceil_2x2s2p1_drops_last", 2, 5, 7, 7, (2,), (2,), (1,), ceil_mode=True,
      real="ceil_mode whose last window would start in the right padding (dropped)"),
    W("ceil_3x3s2p1_cut_window", 1, 4, 5, 6, (3,), (2,), (1,), ceil_mode=True,
      real="ceil_mode window cut at size + padding (its divisor shrinks)"),
    W("asym_2x3_s1x2_p1x1", 1, 9, 6, 10, (2, 3), (1, 2), (1, 1),
      real="asymmetric kernel, stride and padding"),
    W("inception_3x3s1p1_exclude_pad", 1, 12, 8, 8, (3,), (1,), (1,), count_include_pad=False,
      real="Inception branch pool 3x3 stride 1 pad 1 (TF-style count_include_pad=False)"),
    W("empty_stride_2x2", 1, 8, 8, 9, (2, 2), (),
      real="VGG 2x2 pool with the stride left empty (= kernel_size)"),
    W("resnet_avgpool_7x7", 1, 32, 7, 7, (7,), (7,),
      real="ResNet avgpool written as AvgPool2d(7) on the 7x7 map (2048 channels)"),
    W("densenet_transition_2x2s2", 2, 6, 6, 10, (2,), (2,),
      real="DenseNet transition AvgPool2d(2, 2): batch 2, C not a multiple of 4"),
    W("divisor_override_5", 1, 7, 6, 6, (2,), (2,), divisor_override=5,
      real="avg_pool2d divisor_override"),
    W("divisor_override_negative", 1, 4, 5, 5, (3,), (1,), (1,), divisor_override=-3,
      real="a negative divisor_override (PyTorch accepts any nonzero)"),
    W("saturating_avg", 3, 13, 5, 11, (3, 2), (2, 1), (1, 1), ceil_mode=True, output_ratio=0.2,
      real="batch 3, C and W not multiples of 4, an output scale that saturates"),
    W("dilated_3x3_d2_p1", 1, 8, 9, 9, (3,), (1,), (1,), (2,),
      real="dilated max pool (DeepLab-style), dilation 2"),
    W("only_padding_window", 1, 6, 2, 2, (2,), (1,), (1,), (3,),
      real="dilation 3 on a 2x2 map: the window sees only padding (PyTorch: -inf -> -128)"),
]
WINDOW_CASES_BY_NAME = {case.name: case for case in WINDOW_CASES}


@dataclass(frozen=True)
class GlobalCase:
    """One global average pooling of an int8 ``[N, C, H, W]`` input."""

    name: str
    N: int
    C: int
    H: int
    W: int
    real: str = ""


G = GlobalCase
GLOBAL_CASES = [
    G("resnet50_7x7x2048", 1, 2048, 7, 7, real="ResNet-50 global pool: 2048 channels, 7x7"),
    G("mobilenetv2_7x7x1280", 1, 1280, 7, 7, real="MobileNetV2 global pool: 1280 channels, 7x7"),
    G("map_56x56_c64", 1, 64, 56, 56, real="a large 56x56 map: two workers a stream"),
    G("map_112x112_c8", 1, 8, 112, 112,
      real="EfficientNet-B0's first gate: 8 workers a stream, carries into level 2"),
    G("map_136x136_c4", 1, 4, 136, 136, real="36 blocks a stream: two rounds of 32"),
    G("map_17x19_c9_batch3", 3, 9, 17, 19, real="H*W not a power of two, above the workgroup size"),
    G("map_5x3_c13_batch2", 2, 13, 5, 3, real="fewer channel words than a workgroup holds"),
    G("map_1x1_c6", 1, 6, 1, 1, real="a 1x1 map (the pool only requantizes)"),
]
GLOBAL_CASES_BY_NAME = {case.name: case for case in GLOBAL_CASES}


@dataclass(frozen=True)
class AdaptiveCase:
    """One adaptive average pooling of an int8 ``[N, C, H, W]`` input to ``output_size``."""

    name: str
    N: int
    C: int
    H: int
    W: int
    output_size: tuple[int, ...]
    real: str = ""


A = AdaptiveCase
ADAPTIVE_CASES = [
    A("vgg_7x7_of_5x5", 1, 6, 5, 5, (7, 7), real="VGG's head on a small input: overlapping windows"),
    A("alexnet_6x6_of_13x13", 1, 4, 13, 13, (6,), real="AlexNet's head at 224x224 (fewer channels)"),
    A("divides_3_of_6x6", 1, 8, 6, 6, (3,), real="an output that divides the input: avg_pool2d(2)"),
    A("uneven_3x4_of_7x9_batch2", 2, 5, 7, 9, (3, 4), real="uneven windows, C not a multiple of 4"),
    A("from_1x1_to_7x7", 1, 3, 1, 1, (7, 7), real="VGG at 32x32: one pixel repeated"),
    A("same_size_4x3", 1, 4, 4, 3, (4, 3), real="output size = input size (the pool only requantizes)"),
]
ADAPTIVE_CASES_BY_NAME = {case.name: case for case in ADAPTIVE_CASES}


def _generator(name: str, seed: int | None) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()) if seed is None else seed)


def _input(case, gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-128, 128, (case.N, case.C, case.H, case.W), generator=gen, dtype=torch.int8)


def _qparams(gen: torch.Generator, output_ratio: float) -> tuple[float, int, float, int]:
    """input_scale ~ U(0.01, 0.05), zero points in [-20, 20] and [-10, 10]."""
    input_scale = float(torch.rand((), generator=gen, dtype=torch.float64) * 0.04 + 0.01)
    input_zero_point = int(torch.randint(-20, 21, (), generator=gen))
    output_zero_point = int(torch.randint(-10, 11, (), generator=gen))
    return input_scale, input_zero_point, input_scale * output_ratio, output_zero_point


def max_pool_args(case: WindowCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_max_pool2d`` for ``case``: x over the whole int8 range."""
    x = _input(case, _generator(case.name, seed))
    return (x, list(case.kernel), list(case.stride), list(case.padding), list(case.dilation),
            case.ceil_mode)


def avg_pool_args(case: WindowCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_avg_pool2d`` for ``case`` (which must have dilation 1)."""
    gen = _generator(case.name, seed)
    x = _input(case, gen)
    return (x, *_qparams(gen, case.output_ratio), list(case.kernel), list(case.stride),
            list(case.padding), case.ceil_mode, case.count_include_pad, case.divisor_override)


def window_sum_args(case: WindowCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_window_sum`` for ``case`` (which must have full windows)."""
    x = _input(case, _generator(case.name, seed))
    return x, list(case.kernel), list(case.stride)


def global_pool_args(case: GlobalCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_global_avg_pool2d`` for ``case``.

    The output scale is a tenth of the input's: a mean over many values spreads
    far less than one value.
    """
    gen = _generator(case.name, seed)
    x = _input(case, gen)
    return (x, *_qparams(gen, 0.1))


def adaptive_pool_args(case: AdaptiveCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_adaptive_avg_pool2d`` for ``case`` (output scale 0.7 of the input's)."""
    gen = _generator(case.name, seed)
    x = _input(case, gen)
    return (x, *_qparams(gen, 0.7), list(case.output_size))
