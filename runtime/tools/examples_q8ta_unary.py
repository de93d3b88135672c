"""Example cases of the q8ta_unary family (the int8 lookup tables), as a table, and inputs.

Each case is a shape from a real network (the ``real`` field names the
original, shrunk spatially so that it runs quickly on a CPU Vulkan driver)
or one that stresses the packing: channel counts and widths that are not
multiples of 4 (padding channels and 4W4C padding widths), a batch, plain
tensors whose last word is partly past the end. A 4-D case runs in every
packed layout; another rank is a plain tensor. The tables are random, since
the op is a gather whatever the function (the lowering's tables come from
PyTorch's ops: tests/runtime/programs). `lut_inputs` builds the arguments in
schema order; `channel_lut_inputs` those of the per-channel table (the 4-D
cases, one random table per channel), `channel_mean_inputs` those of the
mean of per-channel fp32 tables; `channel_sums_inputs` the window sums and
their tables both take for their first channels. Used by the tests (tests/ops) and, through
runtime/tools/examples.py, the demo. Pure torch; no Vulkan.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LutCase:
    """One lookup: x of `shape` (4-D: packed, else plain) through a random table."""

    name: str
    shape: tuple[int, ...]
    real: str = ""

    @property
    def packed(self) -> bool:
        return len(self.shape) == 4


L = LutCase
LUT_CASES = [
    L("mobilenetv3_hardswish", (1, 16, 12, 12), real="MobileNetV3-Small stem: conv -> hardswish"),
    L("mobilenetv3_se_hardsigmoid", (1, 96, 1, 1), real="MobileNetV3 squeeze-and-excite gate: hardsigmoid"),
    L("efficientnet_silu_c40", (1, 40, 6, 8), real="EfficientNet-B0 MBConv expansion: silu"),
    L("lut_c6_w5_batch2", (2, 6, 3, 5), real="C and W not multiples of 4, batch 2"),
    L("lut_c5_w9", (1, 5, 2, 9), real="padding channels, 4W4C padding widths"),
    L("lut_c3_w1", (1, 3, 1, 1), real="one word, three channels"),
    L("lut_c4_w7", (1, 4, 1, 7), real="7 words in 4C and 4C1W: one 16-byte quad, then 3 words"),
    L("lut_c4_h3_w7", (1, 4, 3, 7), real="21 words in 4C and 4C1W: 5 quads, then 1 word"),
    L("lut_c6_h3_w7", (1, 6, 3, 7), real="42 words in 4C and 4C1W: 10 quads, then 2 words"),
    L("densenet_table_c64_batch2", (2, 64, 3, 5), real="16 channel words (tables read in tiles of 4 words in 4C), 30 pixels: a partial row of 6"),
    L("table_c48_h3_w3", (1, 48, 3, 3), real="12 channel words (3 tiles of 4 in 4C), 9 pixels: a row of 8, then a row of 1"),
    L("table_c29_h2_w9", (1, 29, 2, 9), real="8 channel words, 3 padding channels in the last quad (4C runs with maps), 18 pixels"),
    L("mobilenetv3_classifier_hardswish", (1, 1024), real="MobileNetV3-Small classifier: linear -> hardswish (plain)"),
    L("plain_rows_odd", (3, 7), real="plain, the last word 1 value past the end"),
    L("plain_1d_5", (5,), real="plain 1-D, 3 bytes of the last word past the end"),
    L("plain_1d_17", (17,), real="plain 1-D, 5 words: one 16-byte quad, then 1 word"),
]
LUT_BY_NAME = {case.name: case for case in LUT_CASES}


def lut_inputs(case: LutCase, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Arguments of ``etvk.q8ta_lut`` for ``case`` (x uniform over int8, -128 and 127 first;
    a random table), in schema order."""
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) if seed is None else seed)
    x = torch.randint(-128, 128, case.shape, generator=gen, dtype=torch.int8)
    flat = x.view(-1)
    flat[: min(2, flat.numel())] = torch.tensor([-128, 127], dtype=torch.int8)[: min(2, flat.numel())]
    table = torch.randint(-128, 128, (256,), generator=gen, dtype=torch.int8)
    return x, table


def channel_lut_inputs(case: LutCase, seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Arguments of ``etvk.q8ta_channel_lut`` for the 4-D ``case``: its x (`lut_inputs`) and
    a random int8 ``[C, 256]`` table."""
    x, _ = lut_inputs(case, seed)
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) + 1 if seed is None else seed + 1)
    return x, torch.randint(-128, 128, (case.shape[1], 256), generator=gen, dtype=torch.int8)


def affine_channel_table(channels: int, seed: int, relu: bool = True, taps: int = 1) -> torch.Tensor:
    """An int8 ``[channels, 255 taps + 1]`` table as DenseNet's lowering makes them: for each
    int8 value (taps 1) or window sum S of `taps` int8 values, the dequantized value or the
    window's mean, an eval batch norm with random statistics (negative gammas included),
    optionally relu, then quantized per tensor, all in fp32 torch ops. Such tables are integer
    affine maps (``runtime.families.channel_affine``), which the shaders compute instead of
    reading them."""
    gen = torch.Generator().manual_seed(seed)
    entries = 255 * taps + 1
    s = torch.arange(entries, dtype=torch.float32) - 128 * taps
    x = ((s - 3 * taps) * 0.02 / taps).view(1, 1, entries, 1).expand(1, channels, entries, 1).contiguous()
    mean, var = torch.randn(channels, generator=gen), torch.rand(channels, generator=gen) + 0.1
    gamma, beta = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)
    y = torch.nn.functional.batch_norm(x, mean, var, gamma, beta, False, 0.1, 1e-5)
    if relu:
        y = torch.relu(y)
    scale = float(y.abs().max()) / 127
    quantized = torch.clamp(torch.round(y / scale) + (-128 if relu else 0), -128, 127)  # round half to even
    return quantized.to(torch.int8)[0, :, :, 0].contiguous()


def channel_mean_inputs(case: LutCase, seed: int | None = None) -> tuple:
    """Arguments of ``etvk.q8ta_channel_lut_mean`` for the 4-D ``case``: its x (`lut_inputs`), a
    random fp32 ``[C, 256]`` table (values about a relu's, 0 .. 4) and output qparams that
    cover the means."""
    x, _ = lut_inputs(case, seed)
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) + 2 if seed is None else seed + 2)
    table = torch.rand(case.shape[1], 256, generator=gen) * 4
    return x, table, 4 / 255, -128


def channel_sums_inputs(case: LutCase, taps: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``sums`` and ``sums_table`` for the 4-D ``case``: window sums of `taps` int8 values for
    its first (C + 1) // 2 channels (uniform over -128 * taps .. 127 * taps, both ends first)
    and a random `dtype` table over them (int8, or fp32 values 0 .. 4)."""
    n, c, h, w = case.shape
    gen = torch.Generator().manual_seed(zlib.crc32(case.name.encode()) + 3)
    return window_sums_inputs(gen, (n, (c + 1) // 2, h, w), taps, dtype)


def window_sums_inputs(gen: torch.Generator, shape, taps: int,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 window sums of `shape` ``[N, Cs, H, W]`` over `taps` int8 values (uniform over
    -128 * taps .. 127 * taps, both ends first) and a random `dtype` ``[Cs, 255 * taps + 1]``
    table over them (int8, or fp32 values 0 .. 4), drawn from `gen`."""
    sums = torch.randint(-128 * taps, 127 * taps + 1, tuple(shape), generator=gen, dtype=torch.int32)
    flat = sums.view(-1)
    flat[: min(2, flat.numel())] = torch.tensor([-128 * taps, 127 * taps], dtype=torch.int32)[: min(2, flat.numel())]
    table_shape = (shape[1], 255 * taps + 1)
    table = torch.randint(-128, 128, table_shape, generator=gen, dtype=torch.int8) if dtype == torch.int8 \
        else torch.rand(table_shape, generator=gen) * 4
    return sums, table


def build(axes, shape, gen):
    """A builder for ``runtime.tools.examples.EXAMPLES``: the case at index (the shape's last
    size mod the table's length), with a seed from ``gen``."""
    case = LUT_CASES[(shape[-1] if shape else 0) % len(LUT_CASES)]
    return lut_inputs(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}


def build_channel(axes, shape, gen):
    """`build` for ``etvk.q8ta_channel_lut``: the packed cases only."""
    packed = [case for case in LUT_CASES if case.packed]
    case = packed[(shape[-1] if shape else 0) % len(packed)]
    return channel_lut_inputs(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}


def build_channel_mean(axes, shape, gen):
    """`build` for ``etvk.q8ta_channel_lut_mean``: the packed cases only."""
    packed = [case for case in LUT_CASES if case.packed]
    case = packed[(shape[-1] if shape else 0) % len(packed)]
    return channel_mean_inputs(case, seed=int(torch.randint(0, 2**31, (), generator=gen))), {}
