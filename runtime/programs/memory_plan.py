"""Memory planning: intermediates whose lifetimes do not overlap share a buffer.

Pure arithmetic over allocation requests: each has a size in bytes and a
lifetime, the first and last node positions at which it must hold its
value. `plan_memory` packs them greedily into slots, largest first, each
into the smallest slot that is free for its whole lifetime, else a new one;
a slot is as large as its largest request. The result reports the planned
bytes next to the bytes without sharing and the peak of live bytes (a lower
bound no plan can beat). No Vulkan: the loader allocates the slots. Used by
runtime.programs.loader.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One allocation: ``nbytes``, live from node position ``first`` to ``last`` (inclusive)."""

    nbytes: int
    first: int
    last: int


@dataclass(frozen=True)
class MemoryPlan:
    """Which slot each request lives in, and the slots' sizes.

    Attributes:
        slot_of: for request i, the index of its slot.
        slot_bytes: the size of each slot.
        unshared_bytes: the bytes every request would take alone.
        peak_bytes: the most bytes live at one node position.
    """

    slot_of: tuple[int, ...]
    slot_bytes: tuple[int, ...]
    unshared_bytes: int
    peak_bytes: int

    @property
    def planned_bytes(self) -> int:
        """The bytes of all slots."""
        return sum(self.slot_bytes)


def _overlaps(a: Request, b: Request) -> bool:
    return a.first <= b.last and b.first <= a.last


def plan_memory(requests: list[Request]) -> MemoryPlan:
    """Assigns every request a slot so that requests sharing a slot never live at once."""
    order = sorted(range(len(requests)), key=lambda i: (-requests[i].nbytes, requests[i].first, i))
    slots: list[list[int]] = []  # request indices per slot
    slot_bytes: list[int] = []
    slot_of = [0] * len(requests)
    for i in order:
        free = [s for s, members in enumerate(slots)
                if not any(_overlaps(requests[i], requests[j]) for j in members)]
        if free:  # every existing slot is at least this large (largest requests come first)
            slot = min(free, key=lambda s: (slot_bytes[s], s))
        else:
            slot = len(slots)
            slots.append([])
            slot_bytes.append(requests[i].nbytes)
        slots[slot].append(i)
        slot_of[i] = slot
    positions = sorted({r.first for r in requests})
    peak = max((sum(r.nbytes for r in requests if r.first <= p <= r.last) for p in positions), default=0)
    return MemoryPlan(tuple(slot_of), tuple(slot_bytes), sum(r.nbytes for r in requests), peak)
