"""Reference numerics of the q8ta_unary family: an int8 lookup table.

``q8ta_lut(x, table)`` is ``table[x + 128]`` elementwise: any pointwise
function of a per-tensor int8 input, requantized, takes one of 256 values,
which the caller computes on the host (runtime/programs/lower_lut.py does it
with PyTorch's own ops for the exact qparams of a lowered graph).
``q8ta_channel_lut(x, table)`` is ``table[c, x[:, c] + 128]``: one such table
per channel of an ``[N, C, H, W]`` input. A gather
has no arithmetic, so the shader equals this bit for bit; the ``layout`` a
device keeps the values in does not change them.

Called by the op registry (as the ``torch.ops.etvk.q8ta_lut`` CPU kernel) and
by the tests. It must not import anything from the Vulkan side, nor validate
more than the gather needs (the op stub checks arguments).
"""

from __future__ import annotations

import torch


def q8ta_lut(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[x + 128]`` for int8 `x` of any shape and an int8 ``[256]`` `table`.

    Returns:
        int8 of ``x``'s shape.
    """
    return table[x.long() + 128]


def q8ta_channel_lut(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``table[c, x[:, c] + 128]`` for int8 ``[N, C, H, W]`` `x` and an int8 ``[C, 256]`` `table`.

    Returns:
        int8 of ``x``'s shape.
    """
    channels = torch.arange(x.shape[1]).view(1, -1, 1, 1)
    return table[channels, x.long() + 128]
