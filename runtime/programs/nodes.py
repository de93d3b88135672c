"""The records a lowered program is made of: values, arguments and op calls.

Arguments are plain data: `Ref` (a program value), `Const` (a constant
tensor), Python scalars, strings, None, `torch.dtype` / `torch.device` /
`torch.layout` / `torch.memory_format`, and lists of those. Nothing here is
code. Pure records and two tree walkers; used by every module of
runtime.programs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Ref:
    """An argument that is a program value (an input or a node output), by name."""

    name: str


@dataclass(frozen=True)
class Const:
    """An argument that is a constant tensor of the program, by name."""

    name: str


@dataclass(frozen=True)
class ValueSpec:
    """A value's shape, dtype and layout.

    ``layout`` is None for a plain tensor, or the packed int8 layout of an
    int8 ``[N, C, H, W]`` tensor on the device: ``"PACKED_INT8_CONV2D"``
    (chosen when the program is loaded) or a concrete one.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str | None = None


@dataclass(frozen=True)
class InputCheck:
    """What the values of program input `input` must satisfy, checked on the host before a call.

    ``kind`` is ``"index"`` (every value in ``[0, bound)``: the token ids of an
    embedding table of `bound` rows), ``"position"`` (every value in
    ``[0, bound)``, a state's length, and none before the positions the
    previous call wrote: a cache position must not go backwards until the
    state is reset) or ``"consecutive"`` (the `bound` values count up by one:
    the lowering read the positions as their first one plus 0, 1, ...).
    """

    input: str
    kind: str
    bound: int


@dataclass
class Node:
    """One op call: ``outputs = target(*args, **kwargs)``."""

    name: str
    target: str  # "etvk.q8ta_conv2d.default", "aten.max_pool2d.default", ...
    args: tuple
    kwargs: dict = field(default_factory=dict)
    outputs: tuple[str, ...] = ()

    @property
    def is_etvk(self) -> bool:
        """Whether the target is an ``etvk`` op (generated; may run on the device)."""
        return self.target.startswith("etvk.")

    def reads(self) -> list[str]:
        """The value names this node reads, in argument order (repeats kept)."""
        return [a.name for a in walk_args((self.args, self.kwargs)) if isinstance(a, Ref)]

    def constants(self) -> list[str]:
        """The constant names this node reads."""
        return [a.name for a in walk_args((self.args, self.kwargs)) if isinstance(a, Const)]


def walk_args(value) -> Iterator:
    """Every leaf of an argument structure (lists, tuples, dicts)."""
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from walk_args(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from walk_args(item)
    else:
        yield value


def map_args(value, fn: Callable):
    """`value` with every leaf replaced by ``fn(leaf)`` (lists stay lists, tuples tuples)."""
    if isinstance(value, list):
        return [map_args(item, fn) for item in value]
    if isinstance(value, tuple):
        return tuple(map_args(item, fn) for item in value)
    if isinstance(value, dict):
        return {key: map_args(item, fn) for key, item in value.items()}
    return fn(value)
