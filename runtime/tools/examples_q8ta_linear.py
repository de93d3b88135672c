"""Example cases of `q8ta_linear` (int8 x int8 linear), as a table, and deterministic inputs.

Each `Q8taLinearCase` is a classifier head of a real network (the ``real``
field names it), with M = the batch, or a shape that stresses the kernel: K
and N_out that are not multiples of 4 (rows that do not start on a word),
row counts that leave the last row tile partly empty, one input feature.
`make_inputs` builds the arguments of ``etvk.q8ta_linear`` in schema order.
Used by the tests (tests/ops), the demo (through runtime/tools/examples.py)
and benchmarks. Pure torch; no Vulkan.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from runtime.families.q8ta_linear_weights import linear_weight_sums


@dataclass(frozen=True)
class Q8taLinearCase:
    """One linear: x [M, K], weights [N_out, K]."""

    name: str
    M: int
    K: int
    N_out: int
    bias: bool = True
    real: str = ""


L = Q8taLinearCase
CASES = [
    L("cifar_head_k37_n10", 3, 37, 10, real="a small CIFAR-10 head; K and N_out not multiples of 4"),
    L("tiles_m9_k130_n7", 9, 130, 7, bias=False, real="9 rows: two row tiles of 5; N_out = 7"),
    L("rows32_k64_n12", 32, 64, 12, real="32 rows: four row tiles of 8"),
    L("one_feature_k1_n5", 2, 1, 5, real="K = 1: a single input feature"),
    L("resnet18_head", 2, 512, 1000, real="ResNet-18 fc: 512 -> 1000, batch 2"),
    L("mobilenetv2_head", 1, 1280, 1000, real="MobileNetV2 classifier: 1280 -> 1000"),
    L("resnet50_head", 1, 2048, 1000, bias=False, real="ResNet-50 fc: 2048 -> 1000"),
]
CASES_BY_NAME = {case.name: case for case in CASES}


@dataclass(frozen=True)
class Q8taLinearInputs:
    """Arguments of ``etvk.q8ta_linear``, in schema order."""

    x: torch.Tensor
    input_scale: float
    input_zero_point: int
    weights: torch.Tensor
    weight_sums: torch.Tensor
    weight_scales: torch.Tensor
    bias: torch.Tensor | None
    output_scale: float | None
    output_zero_point: int

    def args(self) -> tuple:
        """The arguments as a tuple, in schema order."""
        return tuple(getattr(self, name) for name in self.__dataclass_fields__)


def make_inputs(case: Q8taLinearCase, seed: int | None = None, fp32_output: bool = False) -> Q8taLinearInputs:
    """Deterministic random arguments for ``case``.

    x is int8 over the whole range, weights int8 in [-127, 127] (symmetric),
    weight scales ~ U(0.001, 0.01), bias ~ N(0, spread of y / 2) or None. The
    output scale is chosen from the spread of y so that outputs fill the int8
    range with a little saturation; ``fp32_output`` gives output_scale None.
    """
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) if seed is None else seed)
    x = torch.randint(-128, 128, (case.M, case.K), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (case.N_out, case.K), generator=gen, dtype=torch.int8)
    weight_scales = (torch.rand(case.N_out, generator=gen, dtype=torch.float64) * 0.009 + 0.001).to(torch.float32)
    input_scale = float(torch.rand((), generator=gen, dtype=torch.float64) * 0.04 + 0.01)
    input_zero_point = int(torch.randint(-20, 21, (), generator=gen))
    # y's spread: x - izp and w are roughly uniform (standard deviations ~74 and ~73).
    sigma = input_scale * weight_scales.double().square().mean().sqrt().item() * 74 * 73 * math.sqrt(case.K)
    bias = None
    if case.bias:
        bias = (torch.randn(case.N_out, generator=gen, dtype=torch.float64) * sigma / 2).to(torch.float32)
    output_scale = None if fp32_output else 6.4 * sigma / 255
    output_zero_point = 0 if fp32_output else int(torch.randint(-10, 11, (), generator=gen))
    return Q8taLinearInputs(
        x=x, input_scale=input_scale, input_zero_point=input_zero_point, weights=w,
        weight_sums=linear_weight_sums(w), weight_scales=weight_scales, bias=bias,
        output_scale=output_scale, output_zero_point=output_zero_point,
    )
