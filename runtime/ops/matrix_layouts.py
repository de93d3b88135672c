"""Where a device keeps the elements of its cooperative matrices, found by running a probe.

VK_KHR_cooperative_matrix leaves it to each implementation which invocation of a
subgroup holds which element of a matrix, and at which component index (``m[i]``
in GLSL). A kernel that reads components by index is right only on devices that lay
the matrix out as it assumes. `has_mma_16x8_accumulator()` answers for the one
layout a kernel relies on today (`MMA_16X8`: linear_qta8a_qga4w_coop_few with SUMS
registers) by running shader ``coopmat_layout_probe`` once per device; devices
without the matrix, or with another layout, answer False. It must not choose
variants (stub_support does) or know any kernel's tiling.
"""

from __future__ import annotations

import weakref

import torch

from runtime.ops.library import catalog
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

PROBE = "coopmat_layout_probe"
SUBGROUP = 32
SLOTS = 8  # components per lane the probe writes (templates/coopmat_layout_probe.glsl.j2)
# A 16x8 int32 accumulator (subgroup scope, 32 invocations) as PTX's mma.m16n8 fragments:
# component i of lane 4 g + t is element (g + 8 (i >> 1), 2 t + (i & 1)), given as 8 row + column.
MMA_16X8 = tuple(tuple(8 * (lane // 4 + 8 * (i >> 1)) + 2 * (lane % 4) + (i & 1) for i in range(4))
                 for lane in range(SUBGROUP))

_ANSWERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Device -> bool


def layout_from_probe(values: torch.Tensor) -> tuple[tuple[int, ...], ...] | None:
    """Each lane's elements (8 row + column, by component) from the probe's int32 output
    (`SUBGROUP` x `SLOTS` slots, then the matrix's length), or None when the output does
    not describe a 16x8 matrix spread over the subgroup (a length over `SLOTS`, a slot
    out of range or written twice, an element held by no lane or by two)."""
    values = values.reshape(-1).tolist()
    length = values[SUBGROUP * SLOTS]
    if not 0 < length <= SLOTS:
        return None
    lanes = tuple(tuple(values[lane * SLOTS:lane * SLOTS + length]) for lane in range(SUBGROUP))
    padding = [v for lane in range(SUBGROUP) for v in values[lane * SLOTS + length:(lane + 1) * SLOTS]]
    if any(v != -1 for v in padding) or sorted(v for lane in lanes for v in lane) != list(range(16 * 8)):
        return None
    return lanes


def has_mma_16x8_accumulator() -> bool:
    """Whether the current device lays a 16x8 int32 accumulator out as `MMA_16X8`: runs
    the probe on its first call for a device (one dispatch), then answers from memory.

    Raises:
        VulkanError: the probe's dispatch failed.
    """
    device = get_device()
    if device not in _ANSWERS:
        _ANSWERS[device] = accumulator_layout() == MMA_16X8
    return _ANSWERS[device]


def accumulator_layout() -> tuple[tuple[int, ...], ...] | None:
    """The current device's 16x8 int32 accumulator layout as `layout_from_probe` reads it:
    runs the probe (one dispatch) every call. None where the probe cannot run.

    Raises:
        VulkanError: the probe's dispatch failed.
    """
    variant = catalog().variant(PROBE)
    if not variant.runnable(get_device().caps)[0]:
        return None
    out = Tensor.from_torch(torch.full((SUBGROUP * SLOTS + 1,), -2, dtype=torch.int32))
    with Stream() as stream:
        stream.dispatch(variant, PROBE, bindings={"t_out": out}, push={}, groups=[1, 1, 1])
        stream.run()
    return layout_from_probe(out.to_torch())
