"""`Recycler`: idle objects kept for reuse by key, within bounds.

The device keeps its idle memory allocations in one (for memory.py). Items
are anything with `.nbytes` and `.destroy()`; this module must not call
Vulkan itself. Used by device.py.
"""

from __future__ import annotations

import threading


class Recycler:
    """Idle objects kept for reuse by key, at most `max_entries` and `max_bytes`; oldest out first.

    Items have `.nbytes` and `.destroy()` (a `Device.track` finalizer, so that
    `Device.close()` destroys items still kept here).

    Args:
        max_entries: how many items are kept at most.
        max_bytes: total `.nbytes` kept at most.
        retire: called with an item right before it is destroyed for the bounds (not at
            `close()`), so that whatever still refers to it can let go first.
    """

    def __init__(self, max_entries: int, max_bytes: int = 0, retire=None):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._retire = retire
        self.entries = self.nbytes = 0
        self.closed = False
        self._idle: dict[object, list] = {}
        self._lock = threading.RLock()  # finalizers may give items back from any thread

    def take(self, key):
        """Remove and return an item kept under `key`, or None."""
        with self._lock:
            return self._take(key)

    def _take(self, key):
        items = self._idle.get(key)
        if not items:
            return None
        item = items.pop()
        if not items:
            del self._idle[key]
        self.entries -= 1
        self.nbytes -= item.nbytes
        return item

    def give(self, key, item) -> None:
        """Keep `item` under `key`, destroying the oldest items over the bounds (or `item` itself)."""
        with self._lock:
            self._give(key, item)

    def _give(self, key, item) -> None:
        if self.closed or item.nbytes > self.max_bytes or not self.max_entries:
            self._destroy(item)
            return
        self._idle.setdefault(key, []).append(item)
        self.entries += 1
        self.nbytes += item.nbytes
        while self.entries > self.max_entries or self.nbytes > self.max_bytes:
            self._destroy(self._take(next(iter(self._idle))))

    def _destroy(self, item) -> None:
        if self._retire is not None and not self.closed:
            self._retire(item)
        item.destroy()

    def close(self) -> None:
        """Destroy every kept item; later `give()`s destroy at once."""
        with self._lock:
            self.closed = True
            while self._idle:
                self._take(next(iter(self._idle))).destroy()
