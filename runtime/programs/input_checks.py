"""The host-side checks on a program's input values, derived from its graph when it is lowered.

A token id outside the embedding table, or a cache position outside a
state, must be a clear `ValueError` before anything runs, never an
out-of-bounds read on the device. `derive_input_checks` finds, without
looking at names: the inputs that an embedding reads as indices (``index``
checks, bounded by the table's rows) and the inputs that the positions of
a state's ``index_copy``, ``etvk.cache_update`` or ``etvk.rope_cache_update`` are computed from
(``position`` checks, bounded by the state's length along the written
dimension). A rewrite may add a ``consecutive`` check (positions p, p+1,
...) it relies on. Pure graph work; used by lower.py. The loader applies the checks (`check_input_values`).
"""

from __future__ import annotations

import torch

from runtime.errors import EtvkError
from runtime.programs.nodes import Const, InputCheck, Ref
from runtime.programs.program import Program

_EMBEDDINGS = ("aten.embedding.default", "etvk.embedding.default")  # (table, indices, ...)
# op writing states at positions -> per state it writes: (state argument, positions argument,
# the output that is the state's new version, the dimension written: None where argument 1
# gives it); the etvk ops write [B, H, L, D] caches along L
_STATE_WRITES = {"aten.index_copy.default": ((0, 2, 0, None),),
                 "etvk.cache_update.default": ((0, 1, 0, 2),),
                 "etvk.rope_cache_update.default": ((5, 7, 1, 2), (6, 7, 2, 2))}


class InputValueError(EtvkError, ValueError):
    """An input value a program cannot take: a token id outside the vocabulary, a cache position
    outside the cache or going backwards. Names the input."""


def derive_input_checks(program: Program) -> list[InputCheck]:
    """The `InputCheck` of every input that indexes an embedding or a state (module docstring)."""
    checks: dict[tuple[str, str], int] = {}
    producers = program.producers()
    version_of = {}  # a state's versions -> the state
    for node in program.nodes:
        first = node.args[0] if node.args else None
        if node.target in _EMBEDDINGS and isinstance(node.args[1], Ref) and isinstance(first, Const) \
                and node.args[1].name in program.inputs:
            key = (node.args[1].name, "index")
            checks[key] = min(checks.get(key, 1 << 62), int(program.constants[first.name].shape[0]))
        for state_at, positions_at, output, dim in _STATE_WRITES.get(node.target, ()):
            written = node.args[state_at]
            state = None if not isinstance(written, Ref) else \
                written.name if written.name in program.state else version_of.get(written.name)
            if state is None:
                continue
            version_of[node.outputs[output]] = state
            length = program.values[state].shape[node.args[1] if dim is None else dim]
            for source in _inputs_behind(node.args[positions_at], producers, program.inputs):
                if not program.values[source].dtype.is_floating_point:
                    key = (source, "position")
                    checks[key] = min(checks.get(key, 1 << 62), length)
    for name, kind in list(checks):  # positions that also index a table (the rotary's)
        if kind == "index" and checks.get((name, "position"), 1 << 62) <= checks[(name, kind)]:
            del checks[(name, kind)]
    return [InputCheck(name, kind, bound) for (name, kind), bound in sorted(checks.items())]


def _inputs_behind(value, producers: dict, inputs: list[str]) -> set[str]:
    """The program inputs that `value` is computed from."""
    found, work, seen = set(), [value], set()
    while work:
        item = work.pop()
        if not isinstance(item, Ref) or item.name in seen:
            continue
        seen.add(item.name)
        if item.name in inputs:
            found.add(item.name)
        elif item.name in producers:
            work.extend(a for a in producers[item.name].args if isinstance(a, Ref))
    return found


# Inputs of at most this many values are checked as Python ints: a decode step's token and
# position are one value each, and torch's reductions cost microseconds a call on the host.
_SMALL = 64


def integer_values(values: torch.Tensor) -> list[int] | torch.Tensor:
    """The values of an integer tensor, flat: Python ints for a small one (`_SMALL`), else the
    flat tensor."""
    flat = values.reshape(-1)
    return flat.tolist() if flat.numel() <= _SMALL else flat


def value_range(values: list[int] | torch.Tensor) -> tuple[int, int]:
    """(min, max) of non-empty `integer_values`."""
    if isinstance(values, list):
        return min(values), max(values)
    low, high = torch.aminmax(values)
    return int(low), int(high)


def _consecutive(values: list[int] | torch.Tensor) -> bool:
    """Whether `integer_values` step by one."""
    if isinstance(values, list):
        return all(b - a == 1 for a, b in zip(values, values[1:], strict=False))
    return bool((values[1:] - values[:-1] == 1).all())


def check_input_values(checks: list[InputCheck], env: dict[str, torch.Tensor], next_position: dict,
                       what: str) -> None:
    """Applies `checks` to the inputs in `env`; `next_position` (input -> the first position the
    next call may use) is advanced past each checked position input.

    Raises:
        InputValueError: the first value that breaks a check, naming the input.
    """
    seen: dict[str, tuple[list[int] | torch.Tensor, int, int]] = {}  # input -> values, min, max
    for check in checks:
        if env[check.input].numel() == 0:
            continue
        if check.input not in seen:
            flat = integer_values(env[check.input])
            seen[check.input] = (flat, *value_range(flat))
        flat, low, high = seen[check.input]
        thing = "token id" if check.kind == "index" else "position"
        if check.kind != "consecutive" and (low < 0 or high >= check.bound):
            bad = low if low < 0 else high
            raise InputValueError(f"{what}: input {check.input!r} holds the {thing} {bad}, outside "
                                  f"[0, {check.bound})")
        if check.kind == "consecutive":
            if not _consecutive(flat):
                shown = flat if isinstance(flat, list) else flat.tolist()
                raise InputValueError(f"{what}: input {check.input!r} must hold consecutive positions "
                                      f"(the program was lowered for that), got {shown}")
            continue
        if check.kind == "position":
            start = next_position.get(check.input, 0)
            if int(flat[0]) < start:
                raise InputValueError(
                    f"{what}: input {check.input!r} goes backwards: it starts at "
                    f"{int(flat[0])}, but the previous call wrote up to {start - 1}; "
                    "call reset() to start again")
    for check in checks:
        if check.kind == "position" and check.input in seen:
            next_position[check.input] = seen[check.input][2] + 1
