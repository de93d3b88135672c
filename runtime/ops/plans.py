"""Call plans: an eager op call replayed with new tensor values (``ETVK_CALL_PLANS=0``: off).

`Op.__call__` (registry.py) of an op whose `OpDef.plannable` is set (codegen/plans.py: its
checks, lets and dispatch read tensor shapes and dtypes only, and call pure helpers only)
keys the call by its arguments (`plan_key`): each host torch tensor by shape and dtype, every
other argument by type and value (floats by their bits, so 0.0 and -0.0 differ). The first
call with a key records as usual into a stream that its `Plan` keeps open, with the device
tensors its host tensors were uploaded to. A later call with the same key copies the new
values into those tensors, replays the recorded command buffer and downloads the outputs: no
checks, lets, variant choice, allocation or recording, which is sound because all of those
follow from the key. A call with a device tensor, an unhashable or unknown argument, the same
host tensor twice, or more than `MAX_PLAN_BYTES` of host tensors is never planned, and a call
that raises makes no plan. Each device keeps at most `MAX_PLANS`, least recently used out
first. Used under the device's lock.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict

import torch

from runtime.vulkan.device import ConfigError
from runtime.vulkan.stream import Stream

MAX_PLANS = 32
MAX_PLAN_BYTES = 1 << 20  # host tensor bytes of a planned call: the small calls host time rules

_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Device -> CallPlans


def plans_for(device) -> CallPlans:
    """The device's `CallPlans` (made on first use, with ``ETVK_CALL_PLANS`` read then)."""
    plans = _PLANS.get(device)
    if plans is None:
        plans = _PLANS[device] = CallPlans(enabled(os.environ.get("ETVK_CALL_PLANS")))
    return plans


def enabled(setting: str | None) -> bool:
    """Whether call plans are on, from ``ETVK_CALL_PLANS`` ("0" or "1"; default on).

    Raises:
        ConfigError: another value.
    """
    if setting in (None, "", "1"):
        return True
    if setting == "0":
        return False
    raise ConfigError(f"ETVK_CALL_PLANS={setting!r} must be 0 (never replay a call plan) or 1")


# Argument types keyed by (type, value) as they are; floats are keyed by their bits, host
# torch tensors by shape and dtype, lists and tuples by their items (tensors not among them);
# anything else (a device tensor, a constant, a subclass of these) is not planned.
_PLAIN = frozenset((bool, int, str, type(None), torch.dtype))


def plan_key(args: tuple, kwargs: dict):
    """The key of a call's arguments, or None when the call must not be planned.

    A flat tuple: the number of positional arguments, then each argument's type and value
    (keyword arguments by sorted name), so that every type tag says how many entries follow.
    Built on every eager call of a plannable op, so kept to plain loops (~2 us).
    """
    parts, tensors = [len(args)], []
    for value in args:
        if not _add(parts, value, tensors):
            return None
    if kwargs:
        for name in sorted(kwargs):
            parts.append(name)
            if not _add(parts, kwargs[name], tensors):
                return None
    if len(tensors) == 1:  # the usual call: no set or generator (1.67 against 2.23 us a key)
        if tensors[0].nbytes > MAX_PLAN_BYTES:
            return None
    elif len({id(t) for t in tensors}) < len(tensors):  # one host tensor in two places
        return None
    elif sum(t.nbytes for t in tensors) > MAX_PLAN_BYTES:
        return None
    return tuple(parts)


def _add(parts: list, value, tensors: list | None) -> bool:
    """Append `value`'s type and key to `parts` (host tensors also to `tensors`); False when
    it cannot be keyed (a tensor in a list: the plan refreshes arguments' own tensors only)."""
    kind = type(value)
    if kind in _PLAIN:
        parts += (kind, value)
    elif kind is float:
        parts += (float, value.hex())
    elif isinstance(value, torch.Tensor):
        if tensors is None:
            return False
        parts += (torch.Tensor, value.shape, value.dtype)
        tensors.append(value)
    elif kind is list or kind is tuple:
        parts += (list, len(value))
        return all(_add(parts, item, None) for item in value)
    else:
        return False
    return True


class Plan:
    """A recorded call: its open stream, where its host tensors went, and its outputs."""

    def __init__(self, stream: Stream, args: tuple, kwargs: dict, outputs):
        self.stream, self.outputs = stream, outputs
        positions = {id(v): name for name, v in (*enumerate(args), *kwargs.items())
                     if isinstance(v, torch.Tensor)}
        # (argument position or keyword, device tensor) of every upload of an argument; an
        # upload of something else (a let's host tensor) follows from the key and stays.
        self.inputs = [(positions[id(value)], tensor) for value, tensor in stream.uploads
                       if id(value) in positions]
        stream.uploads = None  # the first call's host tensors are not kept

    def run(self, args: tuple, kwargs: dict):
        """The call's outputs for new argument values (same key): copy in, replay, copy out."""
        for where, tensor in self.inputs:
            tensor.copy_from(kwargs[where] if isinstance(where, str) else args[where])
        self.stream.replay()
        self.stream.retrace()
        return to_torch(self.outputs)

    def close(self) -> None:
        self.stream.close()


class CallPlans:
    """A device's plans by key, at most `MAX_PLANS`, least recently used out first."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.hits = 0  # calls a plan served
        self._plans: OrderedDict = OrderedDict()  # (op name, key) -> Plan

    def __len__(self) -> int:
        return len(self._plans)

    def call(self, opdef, device, args: tuple, kwargs: dict):
        """`opdef` called on `args` / `kwargs`: by its plan when there is one, else recorded and
        run (made into a plan when the call can be planned). Returns host torch tensors."""
        key = plan_key(args, kwargs) if self.enabled and opdef.plannable else None
        if key is not None:
            plan = self._plans.get((opdef.name, key))
            if plan is not None:
                self._plans.move_to_end((opdef.name, key))
                self.hits += 1
                return plan.run(args, kwargs)
        stream = Stream(device, read_back=True)
        if key is not None:
            stream.uploads = []  # where the host tensors go, for the plan
        try:
            outputs = opdef.record(stream, *args, **kwargs)
            stream.run()
            result = to_torch(outputs)
        except BaseException:
            stream.close()
            raise
        if key is None or not stream.recorded:
            # Dropped before the stream closes, which hands its tensors back in the reverse of
            # the order they were made: the next call on the same sizes gets the same
            # allocations in the same roles, and its stream reuses this recording.
            del outputs
            stream.close()
            return result
        self._plans[(opdef.name, key)] = Plan(stream, args, kwargs, outputs)
        while len(self._plans) > MAX_PLANS:
            self._plans.popitem(last=False)[1].close()
        return result


def to_torch(outputs):
    """Host torch tensors of an op's device outputs (one tensor or a tuple)."""
    if isinstance(outputs, tuple):
        return tuple(t.to_torch() for t in outputs)
    return outputs.to_torch()
