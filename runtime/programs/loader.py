"""Loading a program on a device, and calling it: `runtime.load` and `LoadedProgram`.

Loading does, once:

1. layouts: resolves ``PACKED_INT8_CONV2D`` for this device: the layouts
   its measured conv choices read (runtime/ops/tuning.py), else the rule of
   its GPU family (runtime.families.conv2d_layouts, or ETVK_GPU_FAMILY); a quantize node
   writes its output in the layout its tensor got, and every other packed
   tensor follows its producer;
2. placement: every ``etvk`` node goes to the device, every other node runs
   on the CPU (recording.py). A node whose op cannot run on this device (no
   runnable variant, or over its limits) moves to the CPU, where its reference
   kernel runs, with the reason in `placement()`, and recording starts again:
   a program never fails to load for want of a variant;
3. memory: the first recording logs every intermediate the ops allocate; the
   plan (memory_plan.py) lets those whose lifetimes do not overlap share a
   buffer, and a second recording places them there. Recording creates every
   pipeline, so a call compiles nothing.

State (a decoder's KV cache) lives across calls: on the device when every
node that reads it and the node that makes its update run there (updated
in place when that node writes into it, else copied on the device after
its segment), otherwise on the host, handed to the nodes like an input.
`reset` puts it back to its start.

A call checks the input values the program names (token ids, cache
positions: `runtime.programs.input_checks`), writes the host values each
segment reads into its input tensors, replays the segments in order with
the CPU nodes between them, and downloads only what the CPU or the caller
needs. Calls hold the device's lock, so calls from several threads are
safe and see each other's state updates in order. Called by `runtime.load`
and the tools.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from runtime.errors import TensorTooLarge, UnsupportedDtype
from runtime.families.conv2d_layouts import CONV_OP_ALGORITHMS, CONV_OPS
from runtime.ops import tuning
from runtime.programs.cpu import ProgramInputError, check_inputs, run_node
from runtime.programs.input_checks import check_input_values
from runtime.programs.layouts import conv_geometry, resolve_layouts
from runtime.programs.memory_plan import Request, plan_memory
from runtime.programs.program import Program
from runtime.programs.recording import (
    VIEWS,
    Fallback,
    PlannedAllocator,
    TrackingAllocator,
    record_program,
)
from runtime.vulkan.device import get_device
from runtime.vulkan.memory import Buffer
from runtime.vulkan.tensor import Tensor


class LoadedProgram:
    """A program loaded on a device, ready to be called (see the module docstring).

    Args:
        program: the lowered `Program`.
        device: the `Device`; default `get_device()` (``ETVK_DEVICE`` picks it).
        source: what to call the program in messages (its file).
        progress: called with a line of text as loading goes (None: silent).
    """

    def __init__(self, program: Program, device=None, source: str = "program",
                 progress: Callable[[str], None] | None = None):
        self.device = device or get_device()
        self.source = source
        self.program = resolve_layouts(program, self.device.caps.family, tuning.lookup)
        started = time.perf_counter()
        on_cpu: dict[str, str] = {}
        with self.device.lock:
            while True:
                self._device_state = self._state_on_device(on_cpu)
                tracker = TrackingAllocator(self.device)
                try:
                    first = record_program(self.program, self.device, on_cpu, tracker, source, progress,
                                           self._device_state)
                    break
                except Fallback as fallback:
                    on_cpu[fallback.node] = fallback.reason
                    if progress:
                        progress(f"{fallback.node} runs on the CPU: {fallback.reason}")
            allocs = tracker.allocs
            self._plan = plan_memory(self._lifetimes([a for a in allocs if a.plannable], first))
            del first  # its tensors go back to the device's spare memory before the second recording
            slots = [Buffer(self.device, n) for n in self._plan.slot_bytes]
            self._recording = record_program(self.program, self.device, on_cpu,
                                             PlannedAllocator(self.device, allocs, self._plan, slots),
                                             source, None, self._device_state)
        self._slots = slots
        self._host_state = {name: tensor for name, tensor in self.program.initial_state().items()
                            if name not in self._device_state}
        self._next_position: dict[str, int] = {}
        # what the host downloads on every call: what CPU nodes read, and the host state's updates
        self._read_by_cpu = self._cpu_reads(self._recording) | \
            {self.program.state_updates[n] for n in self._host_state if n in self.program.state_updates}
        needed = self._read_by_cpu | set(self.program.outputs)
        nodes = self.program.nodes
        values = self._recording.device_values
        for segment in self._recording.segments:
            made = {o for p in segment.positions for o in nodes[p].outputs}
            segment.outputs = [(v, values[v]) for v in sorted(made & needed)]
            segment.state_copies = [(tensor, values[update]) for name, tensor in self._device_state.items()
                                    if (update := self.program.state_updates.get(name)) in made
                                    and values[update] is not tensor]
        self.load_seconds = time.perf_counter() - started
        if progress:
            progress(f"loaded {source}: {len(nodes)} nodes, {len(self._recording.segments)} device "
                     f"segments, in {self.load_seconds:.1f} s")

    def _state_on_device(self, on_cpu: dict[str, str]) -> dict[str, Tensor]:
        """A device tensor, at its start, for each state that only device nodes read and update."""
        program = self.program
        on_device = {n.name for n in program.nodes
                     if (n.is_etvk or n.target in VIEWS) and n.name not in on_cpu}
        producers = program.producers()
        found = {}
        for name, start in program.state.items():
            readers = [n.name for n in program.nodes if name in n.reads()]
            update = program.state_updates.get(name)
            if not readers or not set(readers) <= on_device or name in program.outputs or \
                    (update is not None and getattr(producers.get(update), "name", None) not in on_device):
                continue
            spec = program.values[name]
            try:
                tensor = Tensor.zeros(spec.shape, spec.dtype, "buffer", f"{self.source}: state {name}",
                                      self.device)
            except (UnsupportedDtype, TensorTooLarge):
                continue  # the host keeps it
            if start is not None:
                tensor.copy_from(program.constants[start])
            found[name] = tensor
        return found

    def _cpu_reads(self, recording) -> set[str]:
        """Values a CPU node reads."""
        return {name for node, record in zip(self.program.nodes, recording.records, strict=True)
                if record.runs_on == "cpu" for name in node.reads()}

    def _lifetimes(self, allocs, recording) -> list[Request]:
        """Each allocation lives from the node that makes it to the last device node that reads
        it, or to the end of its segment when the host downloads it or a state is copied from
        it; a view's reads and downloads count for the value it views."""
        root = recording.aliases  # a view lives as long as what it views
        last_read: dict[str, int] = {}
        for position, node in enumerate(self.program.nodes):
            if recording.records[position].runs_on == "vulkan":
                for name in node.reads():
                    last_read[root.get(name, name)] = position
        # downloaded, or copied into a state on the device, when the segment making it ends
        segment_end = {p: s.positions[-1] for s in recording.segments for p in s.positions}
        made_at = {o: p for p, node in enumerate(self.program.nodes) for o in node.outputs}
        held: dict[str, int] = {}
        for name in self._cpu_reads(recording) | set(self.program.outputs) | \
                set(self.program.state_updates.values()):
            if made_at.get(name) in segment_end:
                held[root.get(name, name)] = max(held.get(root.get(name, name), 0),
                                                 segment_end[made_at[name]])
        requests = []
        for alloc in allocs:
            last = alloc.position
            if alloc.value is not None:
                last = max(last, last_read.get(alloc.value, last), held.get(alloc.value, last))
            requests.append(Request(alloc.nbytes, alloc.position, last))
        return requests

    # -- calling ------------------------------------------------------------------------------

    def __call__(self, *inputs, **named):
        """Runs the program: torch tensors in, torch tensors out (a tensor or a tuple, as the model).

        Inputs go by position, by name (the exported model's argument names,
        ``loaded(input_ids=..., cache_position=...)``), or both.

        Raises:
            runtime.programs.cpu.ProgramInputError: inputs of the wrong number, name, shape or dtype.
            runtime.programs.input_checks.InputValueError: a token id or cache position out of range,
                or a position going backwards.
        """
        return self._run(self._bind(inputs, named))[0]

    def _bind(self, inputs: tuple, named: dict) -> tuple:
        """The inputs in order, from positional and keyword arguments."""
        if not named:
            return inputs
        names = self.program.inputs
        for name in named:
            if name not in names:
                raise ProgramInputError(f"{self.source}: no input named {name!r}; its inputs are "
                                        f"{', '.join(names)}")
            if names.index(name) < len(inputs):
                raise ProgramInputError(f"{self.source}: input {name!r} given by position and by name")
        missing = [n for n in names[len(inputs):] if n not in named]
        if missing:
            raise ProgramInputError(f"{self.source}: missing input(s) {', '.join(map(repr, missing))}")
        return (*inputs, *(named[n] for n in names[len(inputs):]))

    def reset(self) -> None:
        """Puts the state (the KV cache) back to its start: the next call begins a new sequence."""
        with self.device.lock:
            fresh = self.program.initial_state()
            self._host_state = {name: fresh[name] for name in self._host_state}
            for name, tensor in self._device_state.items():
                tensor.copy_from(fresh[name])
            self._next_position.clear()

    def state_placement(self) -> dict[str, str]:
        """Where each state value lives: ``"vulkan"`` (device memory) or ``"cpu"``."""
        return {name: "vulkan" if name in self._device_state else "cpu" for name in self.program.state}

    def run_resident(self) -> None:
        """Runs the program again on the inputs of the last call without uploading them or
        downloading the outputs: what a call costs when its inputs are already on the device
        (values between the CPU nodes and the device still move). For benchmarks."""
        self._run(self._last_inputs, resident=True)

    def _run(self, inputs, timed: bool = False, resident: bool = False):
        program = self.program
        env = dict(zip(program.inputs, check_inputs(program, inputs, self.source), strict=True))
        self._last_inputs = inputs
        on_host = self._read_by_cpu if resident else self._read_by_cpu | set(program.outputs)
        cpu_seconds = {}
        with self.device.lock:
            check_input_values(program.input_checks, env, self._next_position, self.source)
            env.update(self._host_state)
            for step in self._recording.schedule:
                if isinstance(step, int):
                    start = time.perf_counter()
                    run_node(program.nodes[step], env, program.constants)
                    cpu_seconds[step] = time.perf_counter() - start
                    continue
                for name, tensor in step.inputs:
                    if not (resident and name in program.inputs):
                        tensor.copy_from(_narrowed(env[name], tensor, name, self.source))
                if step.stream.recorded:  # a segment of views alone dispatches nothing
                    step.stream.replay()
                for name, tensor in step.outputs:
                    if name in on_host:
                        env[name] = tensor.to_torch()
                for state, update in step.state_copies:
                    state.memory.copy_from(update.memory)
            self._host_state.update((n, env[program.state_updates[n]]) for n in self._host_state
                                    if n in program.state_updates)
            if resident:
                return None, cpu_seconds, None
            timings = [s.stream.timings() if s.stream.recorded else [] for s in self._recording.segments] \
                if timed else None
        outputs = tuple(env[n] if n in env else program.constants[n] for n in program.outputs)
        return (outputs if program.output_tuple else outputs[0]), cpu_seconds, timings

    def profile(self, *inputs) -> list[dict]:
        """Runs the program once and times every node.

        Returns:
            One dict per node: ``node``, ``runs_on``, ``op`` and ``variant`` (as in
            `placement`) and ``seconds``: GPU time from timestamps for device nodes
            (empty without timestamp support), wall time for CPU nodes.
        """
        _, cpu_seconds, timings = self._run(inputs, timed=True)
        gpu = {}
        for segment, stamps in zip(self._recording.segments, timings, strict=True):
            stamps = iter(stamps)
            for position in segment.positions:
                spent = [s for _, s in (next(stamps, ("", None)) for _ in
                                        self._recording.records[position].dispatches)]
                gpu[position] = sum(spent) if spent and None not in spent else None
        rows = self.placement()
        for position, row in enumerate(rows):
            row["seconds"] = cpu_seconds.get(position, gpu.get(position))
        return rows

    # -- reports ------------------------------------------------------------------------------

    def placement(self) -> list[dict]:
        """One dict per node, in program order.

        Keys: ``node``, ``target``, ``runs_on`` ("vulkan" or "cpu"), ``op`` (what
        ran: for a dispatcher the op it routed to), ``variant`` (the variants it
        dispatched, joined by "+"), ``layout`` (of its packed int8 input as
        resolved on this device, or None), ``tuning`` (for a conv on the device:
        "measured: <choice>" when its settings come from the tuning cache (the
        measured choice of the algorithm it ran), else "rule"; None for other nodes) and ``reason`` (why it runs on the CPU;
        "" on the device).
        """
        rows = []
        for node, record in zip(self.program.nodes, self._recording.records, strict=True):
            packed = [self.program.values[n].layout for n in node.reads()
                      if self.program.values[n].layout is not None]
            ops = list(dict.fromkeys(op for op, _ in record.dispatches))
            on_device = record.runs_on == "vulkan"
            rows.append({
                "node": node.name, "target": node.target, "runs_on": record.runs_on,
                "op": (ops[-1] if ops else node.target) if on_device else node.target,
                "variant": "+".join(v for _, v in record.dispatches) or None,
                "layout": packed[0] if packed else None,
                "tuning": self._tuning(node, ops[-1]) if on_device and ops else None,
                "reason": "" if on_device else record.reason,
            })
        return rows

    def _tuning(self, node, op: str) -> str | None:
        """The `placement` ``tuning`` of a device node whose last dispatch was by `op`."""
        algorithm = CONV_OP_ALGORITHMS.get(op)
        if node.target not in CONV_OPS or algorithm is None:
            return None
        choice = tuning.lookup(conv_geometry(self.program, node), algorithm)
        return f"measured: {choice.label}" if choice else "rule"

    def memory_plan(self) -> dict:
        """The intermediates' memory: ``tensors``, ``unshared_bytes`` (each alone),
        ``planned_bytes`` (the shared buffers), ``buffers`` and ``peak_bytes`` (the most
        live at once, a lower bound); ``input_bytes`` (the segments' input tensors)."""
        inputs = sum(t.memory.nbytes for s in self._recording.segments for _, t in s.inputs
                     if t.memory is not None)
        return {"tensors": len(self._plan.slot_of), "unshared_bytes": self._plan.unshared_bytes,
                "planned_bytes": self._plan.planned_bytes, "buffers": len(self._plan.slot_bytes),
                "peak_bytes": self._plan.peak_bytes, "input_bytes": inputs}


def _narrowed(value, tensor: Tensor, name: str, source: str):
    """`value`, checked to fit the int32 device tensor an int64 host value is uploaded to."""
    if value.dtype == torch.int64 and tensor.dtype == torch.int32 and value.numel() and \
            (int(value.min()) < -2**31 or int(value.max()) >= 2**31):
        raise ProgramInputError(f"{source}: value {name!r} holds integers outside int32, which the "
                                "device's int32 copy of it cannot hold")
    return value


def load(path, device=None, progress: Callable[[str], None] | None = None) -> LoadedProgram:
    """Reads a program file and loads it on `device` (default: ``ETVK_DEVICE``'s or the best one).

    Raises:
        runtime.programs.fileformat.ProgramFileError: the file and its fault.
    """
    return LoadedProgram(Program.load(path), device, str(path), progress)
