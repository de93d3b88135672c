"""Reference numerics of the q8ta_unary family: an int8 lookup table.

``q8ta_lut(x, table)`` is ``table[x + 128]`` elementwise: any pointwise
function of a per-tensor int8 input, requantized, takes one of 256 values,
which the caller computes on the host (runtime/programs/lower_lut.py does it
with PyTorch's own ops for the exact qparams of a lowered graph).
``q8ta_channel_lut(x, table)`` is ``table[c, x[:, c] + 128]``: one such table
per channel of an ``[N, C, H, W]`` input. ``q8ta_channel_lut_mean(x, table,
output_scale, output_zero_point)`` averages fp32 per-channel tables of x over
H and W (the fp32 sum in PyTorch's CPU order, then one correctly rounded
division by H * W) and quantizes the mean; its table may be one row, ``[1,
256]``, for every channel. Both may take ``sums`` (int32
window sums S of K taps, ``[N, Cs, H, W]``) and ``sums_table`` (``[Cs,
255 * K + 1]``): the output's first Cs channels are then ``sums_table[c, S +
128 * K]`` (a function of an average pool's window, which PyTorch keeps in
fp32) and x, with its table, holds the channels after them (x and table are
None where the sums give every channel). A gather has no arithmetic, so the
shader equals this bit for bit; the ``layout`` a device keeps the values in
does not change them.

Called by the op registry (as the ``torch.ops.etvk.q8ta_lut`` CPU kernel) and
by the tests. It must not import anything from the Vulkan side, nor validate
more than the gather needs (the op stub checks arguments).
"""

from __future__ import annotations

import torch

from runtime.families.pool2d import cascade_sum
from runtime.reference.quantize import quantize_per_tensor


def q8ta_lut(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[x + 128]`` for int8 `x` of any shape and an int8 ``[256]`` `table`.

    Returns:
        int8 of ``x``'s shape.
    """
    return table[x.long() + 128]


def q8ta_channel_lut(x: torch.Tensor | None, table: torch.Tensor | None, sums: torch.Tensor | None = None,
                     sums_table: torch.Tensor | None = None, layout: str | None = None) -> torch.Tensor:
    """``table[c, x[:, c] + 128]`` for int8 ``[N, C_x, H, W]`` `x` and a ``[C_x, 256]`` `table`,
    after ``sums_table[c, sums[:, c] + 128 * K]`` for int32 ``[N, Cs, H, W]`` `sums` and a
    ``[Cs, 255 * K + 1]`` `sums_table` where they are given (x and table None: the sums'
    channels alone); `layout` does not change the values.

    Returns:
        the tables' dtype, ``[N, Cs + C_x, H, W]``.
    """
    parts = []
    if sums is not None:
        offset = 128 * ((sums_table.shape[1] - 1) // 255)
        parts.append(sums_table[torch.arange(sums.shape[1]).view(1, -1, 1, 1), sums.long() + offset])
    if x is not None:
        parts.append(table[torch.arange(x.shape[1]).view(1, -1, 1, 1), x.long() + 128])
    return torch.cat(parts, dim=1)


def q8ta_channel_lut_mean(x: torch.Tensor | None, table: torch.Tensor | None, output_scale: float,
                          output_zero_point: int, sums: torch.Tensor | None = None,
                          sums_table: torch.Tensor | None = None, keepdim: bool = False,
                          layout: str | None = None) -> torch.Tensor:
    """The mean over H and W of `q8ta_channel_lut`'s fp32 values (an fp32 ``[C_x, 256]`` `table`,
    or ``[1, 256]`` for every channel, of int8 ``[N, C_x, H, W]`` `x`, after the window sums'
    channels where `sums` and `sums_table` are given), quantized: the fp32 sum over the pixels (p = h * W + w) in
    PyTorch's CPU order (`runtime.families.pool2d.cascade_sum`, each add rounded), divided by
    H * W (fp32 division, correctly rounded): PyTorch's mean of those values, bit for bit.
    `layout` does not change the values.

    Returns:
        int8 ``[N, Cs + C_x]``, or ``[N, Cs + C_x, 1, 1]`` with `keepdim`.
    """
    if table is not None and table.shape[0] == 1:  # one row for every channel
        table = table.expand(x.shape[1], -1)
    values = q8ta_channel_lut(x, table, sums, sums_table).flatten(2)  # [N, C, H * W]: fp32
    n, c, count = values.shape
    total = cascade_sum(values.reshape(n * c, count)).reshape(n, c)
    mean = total / torch.tensor(float(count), dtype=torch.float32)
    out = quantize_per_tensor(mean, output_scale, output_zero_point, -128, 127, torch.int8)
    return out.view(n, c, 1, 1) if keepdim else out
