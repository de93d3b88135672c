"""Prepacked constants: a weight repacked for a shader once, then reused.

An op spec writes ``prepacked("module:function", weight, ...)`` in a `let`.
The first call with these arguments imports ``function`` and calls it; later
calls get the cached `Prepacked`. Tensor arguments are keyed by identity and
version, so an in-place change repacks; other arguments by value. The cache
entry lives as long as the first tensor argument and keeps the other tensor
arguments alive (so their identities cannot be reused); a repack replaces
the function's earlier result for that tensor. A `Prepacked` is a device
`Constant`, so `Stream.upload` keeps one device copy per (device, dtype,
storage) and a weight is packed and uploaded once. It must not know any
packing format (the functions it calls do). Called by generated stubs
(through ``stub_support.prepacked``).
"""

from __future__ import annotations

import importlib
import weakref

import torch

from runtime.vulkan.tensor import Constant

_CACHE: dict[int, dict[tuple, Prepacked]] = {}


class Prepacked(Constant):
    """The result of a packing function (a torch tensor), with its device copies."""

    def __init__(self, value: torch.Tensor, keep_alive: tuple):
        super().__init__(value)
        self._keep_alive = keep_alive


def _key(value):
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), value._version)
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    return value


def prepacked(function: str, *args) -> Prepacked:
    """``function(*args)`` (a "module:function" path), computed once per distinct arguments.

    Raises:
        TypeError: no argument is a host torch tensor (there is nothing to key the cache on).
    """
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    if not tensors:
        raise TypeError(f"prepacked({function!r}) needs at least one host torch tensor argument; "
                        f"got {', '.join(type(a).__name__ for a in args)}")
    anchor = tensors[0]
    entries = _CACHE.get(id(anchor))
    if entries is None:
        entries = _CACHE[id(anchor)] = {}
        weakref.finalize(anchor, _CACHE.pop, id(anchor), None)
    key = (function, tuple(_key(a) for a in args))
    entry = entries.get(key)
    if entry is None:
        module, _, name = function.partition(":")
        value = getattr(importlib.import_module(module), name)(*args)
        # A repack (e.g. after an in-place change) replaces the stale result of this function.
        for stale in [k for k in entries if k[0] == function]:
            del entries[stale]
        entry = entries[key] = Prepacked(value, tensors[1:])
    return entry
