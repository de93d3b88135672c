"""`Recordings`: idle recorded command buffers kept for reuse, by what they hold; LRU, bounded.

A stream's resources (command buffer, fence, descriptor and query pools:
stream.py's `_Resources`) go back here when it closes, still recorded, under
their signature: the pipelines, bound allocations (by serial number, never
reused), push-constant bytes and group counts of the dispatches they hold.
The next stream that would record exactly those dispatches takes them and
submits without recording; another one takes a recording to write over: one
that binds a destroyed allocation first (it can never match again, and its
command buffer is invalid until reset), else, once `max_entries` are kept,
the least recently used. The device's spare memory calls `forget()` before
it destroys an allocation, so kept recordings that bind it are destroyed
first and no descriptor set of a kept pool names a destroyed buffer (legal,
but the one unusual pattern here; Debian's validation layer 1.3.239 crashes
now and then inside vkUpdateDescriptorSets in full test runs, and this
pattern is the suspect: benchmarks/NOTES.md). A recording that binds a destroyed object is only
ever reset or destroyed, never submitted: a match binds the serials of
allocations that are alive. Items have `.destroy()` (a `Device.track`
finalizer); this module must not call Vulkan itself. Kept by device.py, used
by stream.py.
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class Recordings:
    """Idle recorded stream resources by signature, at most `max_entries`, least recently used out first.

    Args:
        max_entries: how many idle items are kept at most.
        reuse: whether `take` hands back a matching recording (False: streams always
            record afresh, into recycled resources; for A/B measurements).
    """

    def __init__(self, max_entries: int, reuse: bool = True):
        self.max_entries, self.reuse = max_entries, reuse
        self.closed = False
        # signature -> (item, weak references to what it binds); least recently given first
        self._idle: OrderedDict = OrderedDict()
        self._lock = threading.Lock()  # streams of several threads share one device

    @property
    def entries(self) -> int:
        """How many idle items are kept."""
        return len(self._idle)

    def take(self, signature):
        """An idle item for a recording of `signature`, removed from the cache, or None (make one).

        Returns the item recorded with `signature` when `reuse` is on (its `.signature` then
        equals it); else one to record again: one that binds a destroyed object, else the least
        recently used one if the cache is full (without `reuse`: the most recently used one,
        as a plain pool would); else None.
        """
        with self._lock:
            if self.reuse:
                found = self._idle.pop(signature, None)
                if found is not None:
                    return found[0]
            for key, (item, bound) in self._idle.items():
                if _stale(bound):
                    del self._idle[key]
                    return item
            if self._idle and (not self.reuse or len(self._idle) >= self.max_entries):
                return self._idle.popitem(last=not self.reuse)[1][0]
            return None

    def give(self, signature, item, bound: tuple) -> None:
        """Keep `item`, recorded with `signature` (None: nothing usable), as the most recently used.

        Args:
            bound: weak references to the objects its recording binds (`weakref.ref`s); once
                one is dead the item is the first to be recorded again.

        Destroys an older item of the same signature, and the least recently used ones over
        `max_entries` (or `item` itself when the cache is closed or holds nothing).
        """
        with self._lock:
            if self.closed or not self.max_entries:
                item.destroy()
                return
            if signature is None:  # nothing usable recorded: matches nothing, recorded again first
                signature, bound = object(), None
            older = self._idle.pop(signature, None)
            if older is not None:
                older[0].destroy()
            self._idle[signature] = (item, bound)
            while len(self._idle) > self.max_entries:
                self._idle.popitem(last=False)[1][0].destroy()

    def forget(self, bound_object) -> None:
        """Destroy the kept items whose recording binds `bound_object` (about to be destroyed)."""
        with self._lock:
            doomed = [key for key, (_, bound) in self._idle.items()
                      if bound is not None and any(ref() is bound_object for ref in bound)]
            for key in doomed:
                self._idle.pop(key)[0].destroy()

    def close(self) -> None:
        """Destroy every kept item; later `give()`s destroy at once."""
        with self._lock:
            self.closed = True
            while self._idle:
                self._idle.popitem(last=False)[1][0].destroy()


def _stale(bound: tuple | None) -> bool:
    return bound is None or any(ref() is None for ref in bound)
