"""Reference numerics of the q8ta_gather family: the int8 channel gather.

A copy of int8 values, no arithmetic: the shader and the reference agree bit
for bit whatever the values. The ``layout`` a device keeps the values in does
not change them.

Called by the op registry (as ``torch.ops.etvk.*`` CPU kernels) and by the
tests. It must not import anything from the Vulkan side, nor validate more
than the indexing needs (the op stubs check arguments).
"""

from __future__ import annotations

import torch


def channel_sources(start: int, count: int, groups: int) -> torch.Tensor:
    """The input channel of each of the `count` output channels: ``start + (c % groups) *
    (count // groups) + c // groups``."""
    c = torch.arange(count)
    return start + (c % groups) * (count // groups) + c // groups


def q8ta_channel_gather(x, start, count, groups=1):
    """``x[:, start : start + count]`` with its channels shuffled in `groups` (1: none).

    Returns:
        int8 ``[N, count, H, W]``.
    """
    return x.index_select(1, channel_sources(start, count, groups)).contiguous()
