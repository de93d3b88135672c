"""One recording of a program on a device: segments of device nodes, each into one stream.

`record_program` places every ``etvk`` node on the device (except those the
caller moved to the CPU) and every other node on the CPU, groups consecutive
device nodes into segments and records each segment's nodes into one
`Stream` through the op registry's record functions (without timestamp
queries: the loader profiles a timed twin of each). A device node reads
device tensors: its producers' outputs, or for a value made on the host a
segment input tensor (buffer storage, in the value's layout) that each call
overwrites. The tensors ops ask for come from an allocator:
`TrackingAllocator` logs them (which node asked, how large, whether a node
output or scratch) for the memory plan, `PlannedAllocator` places them in
the planned buffers (or, for those the loader marks `Alloc.host`, in host
memory) and checks that the recording repeats the logged one.
A node whose op cannot run here raises `Fallback`.

A reshape (`VIEWS`: view, reshape, unsqueeze, flatten, contiguous, ...) of a
value made on the device runs there too, as a view: a tensor of the new shape over the
same buffer, no dispatch (`Recording.aliases` names what it views). An int64
value made on the host enters a segment as int32 (token ids, positions: the
device has no int64; the loader checks that the values fit). An op that
writes an argument in place (`OpDef.aliases`: the KV-cache write) does so
only where the program reads that argument's old value no more; elsewhere
it runs on the CPU (`Fallback`). Used by loader.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from runtime.errors import TensorTooLarge, UnsupportedVariant
from runtime.ops.registry import get_op
from runtime.programs.cpu import resolve_op
from runtime.programs.memory_plan import MemoryPlan
from runtime.programs.nodes import Const, Ref, map_args
from runtime.vulkan.memory import Buffer
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor, buffer_bytes

# Ops that only reshape a contiguous tensor (or, contiguous, leave it as it is): on the device,
# where every value is a contiguous buffer, a view of the same buffer.
VIEWS = frozenset({"aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
                   "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
                   "aten.flatten.using_ints", "aten.alias.default", "aten.contiguous.default"})


class Fallback(Exception):
    """A node that cannot run on this device: its name and why."""

    def __init__(self, node: str, reason: str):
        super().__init__(node, reason)
        self.node, self.reason = node, reason


@dataclass
class Alloc:
    """One tensor an op asked its stream for while the node at `position` was recorded."""

    position: int
    shape: tuple
    dtype: torch.dtype
    storage: str
    nbytes: int
    value: str | None = None  # the node output it became; None for scratch
    host: bool = False  # placed in host memory: the host reads it every call, no later device node

    @property
    def plannable(self) -> bool:
        """Buffers share planned memory; images, empty tensors and host-placed ones do not."""
        return self.storage == "buffer" and self.nbytes > 0 and not self.host


@dataclass
class Segment:
    """Consecutive device nodes, recorded into one stream."""

    positions: list[int]
    stream: Stream | None = None
    inputs: list[tuple[str, Tensor]] = field(default_factory=list)  # host values written per call
    outputs: list[tuple[str, Tensor]] = field(default_factory=list)  # values downloaded per call
    # (state tensor, the tensor holding its update) copied on the device after each replay
    state_copies: list[tuple[Tensor, Tensor]] = field(default_factory=list)
    timed_stream: Stream | None = None  # the stream with timestamps, made when first profiled


@dataclass
class NodeRecord:
    """Where a node runs, why, and (on the device) what it dispatched: (op, variant) pairs."""

    runs_on: str
    reason: str = ""
    dispatches: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Recording:
    """What `record_program` made: per-node records, segments, and the run order
    (`schedule`: a node position for a CPU node, or a `Segment`)."""

    records: list[NodeRecord]
    segments: list[Segment]
    schedule: list
    device_values: dict[str, Tensor]
    aliases: dict[str, str] = field(default_factory=dict)  # a device view -> the value it views


class TrackingAllocator:
    """Plain new tensors, each logged as an `Alloc` of the node being recorded."""

    def __init__(self, device):
        self.device, self.position = device, 0
        self.allocs: list[Alloc] = []
        self._current: list[tuple[Alloc, Tensor]] = []

    def __call__(self, shape, dtype, storage, label, layout) -> Tensor:
        tensor = Tensor.empty(shape, dtype, storage, label, self.device, layout)
        nbytes = buffer_bytes(shape, dtype, tensor.layout) if tensor.memory is not None else 0
        alloc = Alloc(self.position, tuple(shape), dtype, storage, nbytes)
        self.allocs.append(alloc)
        self._current.append((alloc, tensor))
        return tensor

    def node_done(self, outputs: dict[str, Tensor]) -> None:
        """Marks which of the node's allocations became which output."""
        for alloc, tensor in self._current:
            alloc.value = next((name for name, t in outputs.items() if t is tensor), None)
        self._current = []


class PlannedAllocator:
    """Tensors in the planned buffers, in the order the tracked recording asked for them."""

    def __init__(self, device, allocs: list[Alloc], plan: MemoryPlan, slots: list[Buffer]):
        self.device, self.position = device, 0
        self._allocs, self._next = allocs, 0
        self._slots = iter(slots[s] for s in plan.slot_of)

    def __call__(self, shape, dtype, storage, label, layout) -> Tensor:
        expected = self._allocs[self._next] if self._next < len(self._allocs) else None
        if expected is None or (expected.position, expected.shape, expected.dtype, expected.storage) != (
                self.position, tuple(shape), dtype, storage):
            raise RuntimeError(f"{label}: the second recording did not repeat the first one's "
                               "allocations (an op's recording is not deterministic)")
        self._next += 1
        if expected.host:
            return Tensor.empty(shape, dtype, storage, label, self.device, layout, placement="host")
        if not expected.plannable:
            return Tensor.empty(shape, dtype, storage, label, self.device, layout)
        return Tensor(shape, dtype, storage, label, self.device, layout, next(self._slots))

    def node_done(self, outputs: dict[str, Tensor]) -> None:
        """Nothing to learn the second time."""


def _schedule(records: list[NodeRecord]) -> tuple[list[Segment], list]:
    segments, schedule = [], []
    for position, record in enumerate(records):
        if record.runs_on == "cpu":
            schedule.append(position)
        elif schedule and isinstance(schedule[-1], Segment):
            schedule[-1].positions.append(position)
        else:
            segments.append(Segment([position]))
            schedule.append(segments[-1])
    return segments, schedule


def record_program(program, device, on_cpu: dict[str, str], allocate, label: str,
                   progress: Callable[[str], None] | None = None,
                   state: dict[str, Tensor] | None = None, constants: dict | None = None) -> Recording:
    """Records every device node of `program` (see the module docstring).

    Args:
        program: the `Program`, its layouts resolved for `device`.
        device: the `Device`.
        on_cpu: node name -> why it runs on the CPU although it is an etvk op.
        allocate: a `TrackingAllocator` or `PlannedAllocator`.
        label: the program's name in messages.
        progress: called with a line per node recorded, or None.
        state: the state values kept on the device, by name: device nodes read these
            tensors themselves (no segment input, no upload).
        constants: ``id(constant tensor) -> Constant``: the program's constants, uploaded once
            and shared by its recordings (`Stream`'s ``constants``); None: each recording's own.

    Raises:
        Fallback: a node's op cannot run on this device.
    """
    records = _placement(program, on_cpu, set(state or {}))
    segments, schedule = _schedule(records)
    on_device: dict[str, Tensor] = dict(state or {})
    aliases: dict[str, str] = {}
    last_read = {name: position for position, node in enumerate(program.nodes) for name in node.reads()}
    for segment in segments:
        segment.stream = Stream(device, allocate=allocate, constants=constants, timestamps=False)
        for position in segment.positions:
            node = program.nodes[position]
            if progress:
                progress(f"recording {position + 1}/{len(program.nodes)}: {node.name} ({node.target})")

            def argument(a, segment=segment):
                if isinstance(a, Const):
                    return program.constants[a.name]
                if not isinstance(a, Ref):
                    return a
                if a.name not in on_device:  # made on the host: an input of this segment
                    spec = program.values[a.name]
                    dtype = torch.int32 if spec.dtype == torch.int64 else spec.dtype
                    tensor = Tensor.empty(spec.shape, dtype, "buffer", f"{label}: {a.name}",
                                          device, spec.layout)
                    segment.inputs.append((a.name, tensor))
                    on_device[a.name] = tensor
                return on_device[a.name]

            if node.target in VIEWS:
                source = argument(node.args[0])
                if source.storage != "buffer" or source.layout != "contiguous":
                    raise Fallback(node.name, f"a view of a {source.storage} in layout {source.layout}")
                spec = program.values[node.outputs[0]]
                on_device[node.outputs[0]] = Tensor(spec.shape, source.dtype, "buffer",
                                                    f"{label}: {node.outputs[0]}", device, None,
                                                    source.memory)
                aliases[node.outputs[0]] = aliases.get(node.args[0].name, node.args[0].name)
                continue
            _check_writes_in_place(program, position, aliases, last_read)
            allocate.position = position
            before = len(segment.stream.dispatched)
            try:
                result = get_op(node.target).record(segment.stream, *map_args(node.args, argument),
                                                    **map_args(node.kwargs, argument))
            except (UnsupportedVariant, TensorTooLarge) as exc:
                raise Fallback(node.name, str(exc)) from None
            outputs = dict(zip(node.outputs, result if isinstance(result, tuple) else (result,),
                               strict=True))
            allocate.node_done(outputs)
            on_device.update(outputs)
            records[position].dispatches = segment.stream.dispatched[before:]
        segment.stream.finish()
    return Recording(records, segments, schedule, on_device, aliases)


def _check_writes_in_place(program, position: int, aliases: dict[str, str],
                           last_read: dict[str, int]) -> None:
    """An op that writes an argument in place (an output with `alias` in its spec) may do so on
    the device only where the program reads that argument's old value no more: no later node
    reads it or a view of it, and it is no program output.

    Raises:
        Fallback: it is read again (the node's reference kernel, functional, runs on the CPU).
    """
    node = program.nodes[position]
    if not node.is_etvk or not get_op(node.target).opdef.aliases:
        return
    arguments = [a.name for a in resolve_op(node.target)._schema.arguments]
    for _, name in get_op(node.target).opdef.aliases:
        written = node.args[arguments.index(name)] if arguments.index(name) < len(node.args) else None
        if not isinstance(written, Ref):
            continue
        views = [v for v, root in aliases.items() if root == aliases.get(written.name, written.name)]
        if any(last_read.get(v, -1) > position for v in [written.name, *views]) or \
                written.name in program.outputs:
            raise Fallback(node.name, f"it writes {written.name} in place, which the program reads "
                                      "again later")


def _placement(program, on_cpu: dict[str, str], on_device: set[str]) -> list[NodeRecord]:
    """Where each node runs: an ``etvk`` node on the device unless `on_cpu` names it, a view
    (`VIEWS`) where the value it views is made (`on_device`: the values kept there), any
    other node on the CPU."""
    on_device = set(on_device)
    records = []
    for node in program.nodes:
        source = node.args[0] if node.args else None
        device = node.name not in on_cpu and (node.is_etvk or (
            node.target in VIEWS and isinstance(source, Ref) and source.name in on_device))
        records.append(NodeRecord("vulkan") if device else
                       NodeRecord("cpu", on_cpu.get(node.name) or f"no generated op for {node.target}"))
        if device:
            on_device.update(node.outputs)
    return records
