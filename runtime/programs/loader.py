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
   buffer, and a second recording places them there. A value the host reads
   every call (an output, what a CPU node reads) that no later device node
   reads, larger than `DIRECT_READ_LIMIT` and at most `HOST_OUTPUT_BYTES` (as an
   eager call's outputs), gets a buffer of its own in host memory instead: the
   GPU writes it there and the host reads it at memory speed, with no staging
   copy (a GPU's mapped device memory is read uncached). Larger ones stay in
   device memory: on the H200 a prefill's 263 MB of logits written to host
   memory took its GPU time from 11.6 to 89.1 ms.
   Recording creates every pipeline, so a call compiles nothing.

State (a decoder's KV cache) lives across calls: on the device when every
node that reads it and the node that makes its update run there (updated
in place when that node writes into it, else copied on the device after
its segment), otherwise on the host, handed to the nodes like an input.
`reset` puts it back to its start.

A call checks the input values the program names (token ids, cache
positions: `runtime.programs.input_checks`), writes the host values each
segment reads into its input tensors, replays the segments in order with
the CPU nodes between them, and downloads only what the CPU or the caller
needs. A program with a dynamic token count (runtime.programs.token_counts)
has every graph recorded against the same device state and constants; a
call runs the graphs its tokens split into, its values checked whole first.
`last_token` runs, for each count of more than one token, its last-token
graph (runtime.programs.last_token: the per-token tail on the last row
alone), recorded beside the full graph in the full graph's planned buffers
where they fit (the two never run at once), and downloads only the last
token's outputs. Calls hold the
device's lock, so calls from several threads are safe and see each other's
state updates in order. Called by `runtime.load` and the tools.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from runtime.errors import TensorTooLarge, UnsupportedDtype
from runtime.families.conv2d_layouts import CONV_OP_ALGORITHMS, CONV_OPS
from runtime.ops import tuning
from runtime.ops.stub_support import coop_gemm_kernels
from runtime.programs.chunking import join_outputs, split_call
from runtime.programs.cpu import ProgramInputError, check_inputs, run_node
from runtime.programs.input_checks import check_input_values, integer_values, value_range
from runtime.programs.last_token import last_token_program
from runtime.programs.layouts import conv_geometry, resolve_layouts
from runtime.programs.memory_plan import Request, plan_memory
from runtime.programs.nodes import InputCheck
from runtime.programs.program import Program
from runtime.programs.recording import (
    VIEWS,
    Fallback,
    PlannedAllocator,
    TrackingAllocator,
    record_program,
)
from runtime.vulkan.device import get_device
from runtime.vulkan.memory import DIRECT_READ_LIMIT, Buffer, zero_all
from runtime.vulkan.stream import HOST_OUTPUT_BYTES
from runtime.vulkan.tensor import Constant, Tensor


class _Graph:
    """One graph of a program recorded on the device (a decoder with a dynamic token count has
    one per count): its recording, its memory plan, and what a call of it moves."""

    def __init__(self, program: Program, device, source: str, on_cpu: dict[str, str],
                 device_state: dict[str, Tensor], constants: dict,
                 progress: Callable[[str], None] | None, spare: list[Buffer] = ()):
        self.program = program
        tracker = TrackingAllocator(device)
        first = record_program(program, device, on_cpu, tracker, source, progress, device_state, constants)
        allocs = tracker.allocs
        # what the host downloads on every call: what CPU nodes read, and the host state's updates
        # (the second recording places the nodes as this one does)
        self.read_by_cpu = self._cpu_reads(first) | \
            {u for n, u in program.state_updates.items() if n not in device_state}
        root = first.aliases
        downloaded = {root.get(n, n) for n in self.read_by_cpu | set(program.outputs)}
        read_later = self._device_reads_after(first)
        for alloc in allocs:  # read by the host every call and by no later device node: host memory
            alloc.host = alloc.storage == "buffer" and DIRECT_READ_LIMIT < alloc.nbytes <= HOST_OUTPUT_BYTES \
                and alloc.value in downloaded and alloc.value not in read_later
        self.plan = plan_memory(self._lifetimes([a for a in allocs if a.plannable], first))
        del first  # its tensors go back to the device's spare memory before the second recording
        self.slots = _slot_buffers(device, self.plan.slot_bytes, spare)
        self.recording = record_program(program, device, on_cpu,
                                        PlannedAllocator(device, allocs, self.plan, self.slots),
                                        source, None, device_state, constants)
        needed = self.read_by_cpu | set(program.outputs)
        nodes = program.nodes
        values = self.recording.device_values
        for segment in self.recording.segments:
            made = {o for p in segment.positions for o in nodes[p].outputs}
            segment.outputs = [(v, values[v]) for v in sorted(made & needed)]
            segment.state_copies = [(tensor, values[update]) for name, tensor in device_state.items()
                                    if (update := program.state_updates.get(name)) in made
                                    and values[update] is not tensor]

    def _device_reads_after(self, recording) -> set[str]:
        """Values (and the values their views view) that a device node reads after the node
        that makes them."""
        root = recording.aliases
        made_at = {o: p for p, node in enumerate(self.program.nodes) for o in node.outputs}
        return {root.get(name, name) for position, node in enumerate(self.program.nodes)
                if recording.records[position].runs_on == "vulkan"
                for name in node.reads() if made_at.get(root.get(name, name), -1) < position}

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
        family, coop = self.device.caps.family, coop_gemm_kernels(self.device.caps)
        self.program = resolve_layouts(program, family, tuning.lookup, coop)
        programs = {self.program.tokens: self.program} | \
            {size: resolve_layouts(p, family, tuning.lookup, coop)
             for size, p in sorted(program.specializations.items())}
        # a token count's graph with its per-token tail on the last row, for `last_token`
        lasts = {size: last for size, p in programs.items()
                 if (last := last_token_program(p, self.program)) is not None}
        # the constants, uploaded once for every graph's recordings
        self._constants = {id(t): Constant(t) for t in self.program.constants.values()}
        started = time.perf_counter()
        keyed = programs | {("last", size): p for size, p in lasts.items()}
        on_cpu: dict[object, dict[str, str]] = {key: {} for key in keyed}
        with self.device.lock:
            while True:
                self._device_state = self._state_on_device(keyed, on_cpu)
                try:
                    self._graphs = {size: self._record(size, p, on_cpu[size], progress)
                                    for size, p in programs.items()}
                    # they share the slots of the full graph's (the two never run at once)
                    self._last_graphs = {size: self._record(("last", size), p, on_cpu["last", size], progress,
                                                            self._graphs[size].slots)
                                         for size, p in lasts.items()}
                    break
                except _GraphFallback as fallback:
                    on_cpu[fallback.key][fallback.node] = fallback.reason
                    if progress:
                        progress(f"{fallback.node} runs on the CPU: {fallback.reason}")
        self._host_state = {name: tensor for name, tensor in self.program.initial_state().items()
                            if name not in self._device_state}
        self._next_position: dict[str, int] = {}
        self._last_call: list = []
        self.load_seconds = time.perf_counter() - started
        if progress:
            segments = sum(len(g.recording.segments) for g in (*self._graphs.values(), *self._last_graphs.values()))
            counts = f", {len(programs)} token counts ({len(lasts)} last-token graphs)" if len(programs) > 1 else ""
            progress(f"loaded {source}: {len(self.program.nodes)} nodes, {segments} device segments"
                     f"{counts}, in {self.load_seconds:.1f} s")

    def _record(self, key, program: Program, on_cpu: dict[str, str], progress, spare=()) -> _Graph:
        """The `_Graph` of one graph's program (`key`: as `_GraphFallback`'s), its memory in
        buffers of `spare` where they fit."""
        try:
            return _Graph(program, self.device, self.source, on_cpu, self._device_state, self._constants,
                          progress, spare)
        except Fallback as fallback:
            raise _GraphFallback(key, fallback.node, fallback.reason) from None

    def _state_on_device(self, programs: dict, on_cpu: dict) -> dict[str, Tensor]:
        """A device tensor, at its start, for each state that only device nodes read and update
        (in every graph)."""
        found = {}
        for name, start in self.program.state.items():
            if not all(self._device_only(p, name, on_cpu[key]) for key, p in programs.items()):
                continue
            spec = self.program.values[name]
            try:
                tensor = Tensor.zeros(spec.shape, spec.dtype, "buffer", f"{self.source}: state {name}",
                                      self.device)
            except (UnsupportedDtype, TensorTooLarge):
                continue  # the host keeps it
            if start is not None:
                tensor.copy_from(self.program.constants[start])
            found[name] = tensor
        return found

    @staticmethod
    def _device_only(program: Program, name: str, on_cpu: dict[str, str]) -> bool:
        """Whether every node of `program` that reads state `name`, and the one making its
        update, run on the device (and the state is no output)."""
        on_device = {n.name for n in program.nodes
                     if (n.is_etvk or n.target in VIEWS) and n.name not in on_cpu}
        readers = [n.name for n in program.nodes if name in n.reads()]
        update = program.state_updates.get(name)
        producer = program.producers().get(update) if update is not None else None
        return bool(readers) and set(readers) <= on_device and name not in program.outputs and \
            (update is None or getattr(producer, "name", None) in on_device)

    # -- calling ------------------------------------------------------------------------------

    def __call__(self, *inputs, **named):
        """Runs the program: torch tensors in, torch tensors out (a tensor or a tuple, as the model).

        Inputs go by position, by name (the exported model's argument names,
        ``loaded(input_ids=..., cache_position=...)``), or both. A decoder with a
        dynamic token count takes any count of tokens up to its cache a call: the
        largest counts it was lowered for first, their outputs joined along the
        token dimension.

        Raises:
            runtime.programs.cpu.ProgramInputError: inputs of the wrong number, name, shape or dtype.
            runtime.programs.input_checks.InputValueError: a token id or cache position out of range,
                or a position going backwards.
        """
        inputs = self._bind(inputs, named)
        with self.device.lock:
            parts = self._split(inputs)
            results = [self._run(graph, part)[0] for graph, part in parts]
        self._last_call = parts
        return join_outputs(self.program, results)

    def last_token(self, *inputs, **named):
        """A call (as `__call__`) of a program with a dynamic token count whose outputs hold only
        the call's last token along their token dimension: what generation reads (the next
        token from the last logits), bit for bit the last row of a call's.

        Every chunk runs its token count's last-token graph (runtime.programs.last_token), where
        the per-token tail (the final norm and the lm_head, and the last layer's projection
        and MLP before them) runs on the chunk's last row alone; only the last chunk's outputs
        are downloaded, and earlier chunks download nothing (a 512-token prompt's logits are
        263 MB at Llama-3.2-1B's vocabulary). A count without one (one token, or a graph
        without such a tail) runs its full graph, its last row downloaded.

        Raises:
            ProgramInputError: the program has static shapes (its outputs hold every token of a
                call); and as `__call__`.
        """
        if not self.program.token_inputs:
            raise ProgramInputError(f"{self.source}: last_token needs a program with a dynamic token "
                                    "count; this one has static shapes")
        inputs = self._bind(inputs, named)
        with self.device.lock:
            parts = [(self._last_graphs.get(graph.program.tokens, graph), part) for graph, part in self._split(inputs)]
            for graph, part in parts[:-1]:
                self._run(graph, part, download="none")
            result = self._run(*parts[-1], download="last")[0]
        self._last_call = parts
        return result

    def _split(self, inputs: tuple) -> list[tuple[_Graph, tuple]]:
        """The graphs a call runs, each with its inputs: one, or for a dynamic token count the
        chunks of the call's tokens (its input values checked whole first)."""
        program = self.program
        if not program.token_inputs:
            return [(self._graphs[None], inputs)]
        if len(inputs) != len(program.inputs):
            check_inputs(program, inputs, self.source)  # raises: the wrong count of inputs
        tokens = self._tokens(inputs)
        parts = [(self._graphs[size], tuple(check_inputs(self._graphs[size].program, part, self.source)))
                 for size, part in split_call(program, inputs, tokens)]
        # the values of the whole call, before any chunk runs (the chunks check theirs again)
        env = dict(zip(program.inputs, inputs, strict=True))
        checks = [c for c in program.input_checks if c.kind != "consecutive"] + \
            [InputCheck(c.input, "consecutive", tokens) for c in program.input_checks if c.kind == "consecutive"]
        check_input_values(checks, env, dict(self._next_position), self.source)
        return parts

    def _tokens(self, inputs: tuple) -> int:
        """The tokens of a call of a program with a dynamic token count.

        Raises:
            ProgramInputError: a token input that is no tensor, inputs that disagree, or no tokens.
        """
        program = self.program
        counts = {}
        for name, dim in program.token_inputs.items():
            index = program.inputs.index(name)
            value = inputs[index] if index < len(inputs) else None
            if not isinstance(value, torch.Tensor) or value.dim() != len(program.values[name].shape):
                raise ProgramInputError(f"{self.source}: input {name!r} must be a tensor of "
                                        f"{len(program.values[name].shape)} dimensions")
            counts[name] = value.shape[dim]
        if len(set(counts.values())) != 1 or min(counts.values()) < 1:
            raise ProgramInputError(f"{self.source}: the inputs must hold the same number of tokens, "
                                    f"at least one; got {counts}")
        return next(iter(counts.values()))

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
            self._host_state = {name: self.program.initial_value(name) for name in self._host_state}
            zeros = []
            for name, tensor in self._device_state.items():
                if self.program.state[name]:  # starts as a constant
                    tensor.copy_from(self.program.initial_value(name))
                else:  # starts at zero: filled on the device (a decoder's KV cache: no upload)
                    zeros.append(tensor.memory)
            zero_all(zeros)  # one submission for every cache
            self._next_position.clear()

    def state_placement(self) -> dict[str, str]:
        """Where each state value lives: ``"vulkan"`` (device memory) or ``"cpu"``."""
        return {name: "vulkan" if name in self._device_state else "cpu" for name in self.program.state}

    @property
    def token_counts(self) -> list[int]:
        """The token counts a call runs as one graph (a dynamic token count); [] for static shapes."""
        return sorted(size for size in self._graphs if size is not None)

    def run_resident(self) -> None:
        """Runs the program again on the inputs of the last call without uploading them or
        downloading the outputs: what a call costs when its inputs are already on the device
        (values between the CPU nodes and the device still move). For benchmarks."""
        with self.device.lock:
            for graph, inputs in self._last_call:
                self._run(graph, inputs, upload=False, download="none")

    def _run(self, graph: _Graph, inputs, timed: bool = False, upload: bool = True, download: str = "all"):
        """Runs one graph: uploads its inputs (unless not `upload`: those of the last call are
        on the device), downloads what its CPU nodes read and its outputs: ``"all"``, ``"last"``
        (the last token of those with a token dimension) or ``"none"`` (then it returns None)."""
        program = graph.program
        env = dict(zip(program.inputs, check_inputs(program, inputs, self.source), strict=True))
        on_host = graph.read_by_cpu if download == "none" else graph.read_by_cpu | set(program.outputs)
        last = {name: dim for name, dim in zip(program.outputs, program.token_outputs, strict=False)
                if dim is not None and download == "last" and name not in graph.read_by_cpu}
        cpu_seconds = {}
        with self.device.lock:
            check_input_values(program.input_checks, env, self._next_position, self.source)
            env.update(self._host_state)
            for step in graph.recording.schedule:
                if isinstance(step, int):
                    start = time.perf_counter()
                    run_node(program.nodes[step], env, program.constants)
                    cpu_seconds[step] = time.perf_counter() - start
                    continue
                for name, tensor in step.inputs:
                    if upload or name not in program.inputs:
                        tensor.copy_from(_narrowed(env[name], tensor, name, self.source))
                if step.stream.recorded:  # a segment of views alone dispatches nothing
                    (self._timed(step) if timed else step.stream).replay()
                for name, tensor in step.outputs:
                    if name in last:
                        env[name] = tensor.to_torch_last(last[name])
                    elif name in on_host:
                        env[name] = tensor.to_torch()
                for state, update in step.state_copies:
                    state.memory.copy_from(update.memory)
            self._host_state.update((n, env[program.state_updates[n]]) for n in self._host_state
                                    if n in program.state_updates)
            if download == "none":
                return None, cpu_seconds, None
            timings = [self._timed(s).timings() if s.stream.recorded else [] for s in graph.recording.segments] \
                if timed else None
        outputs = tuple(env[n] if n in env else program.constants[n] for n in program.outputs)
        if download == "last":  # those not narrowed as they were downloaded (made by a CPU node)
            outputs = tuple(o.narrow(d, o.shape[d] - 1, 1) if d is not None else o
                            for o, d in zip(outputs, program.token_outputs, strict=True))
        return (outputs if program.output_tuple else outputs[0]), cpu_seconds, timings

    def _timed(self, segment):
        """The segment's stream recorded with timestamps (made on first use: calls replay the
        stream without them)."""
        if segment.timed_stream is None:
            segment.timed_stream = segment.stream.timed_twin()
        return segment.timed_stream

    def profile(self, *inputs, last_token: bool = False) -> list[dict]:
        """Runs the program once and times every node (for a dynamic token count, a call of one
        of its `token_counts`; `last_token`: of its last-token graph, as `last_token` runs it).

        Returns:
            One dict per node: ``node``, ``runs_on``, ``op`` and ``variant`` (as in
            `placement`) and ``seconds``: GPU time from timestamps for device nodes
            (empty without timestamp support), wall time for CPU nodes.

        Raises:
            ProgramInputError: a token count the program has no graph for.
        """
        with self.device.lock:
            parts = self._split(inputs)
            if len(parts) != 1:
                raise ProgramInputError(f"{self.source}: profile takes a call of one graph: "
                                        f"{', '.join(map(str, self.token_counts))} tokens")
            (graph, part), = parts
            if last_token:
                graph = self._graph(graph.program.tokens, last_token)
            _, cpu_seconds, timings = self._run(graph, part, timed=True)
        gpu = {}
        for segment, stamps in zip(graph.recording.segments, timings, strict=True):
            stamps = iter(stamps)
            for position in segment.positions:
                spent = [s for _, s in (next(stamps, ("", None)) for _ in
                                        graph.recording.records[position].dispatches)]
                gpu[position] = sum(spent) if spent and None not in spent else None
        rows = self._placement(graph)
        for position, row in enumerate(rows):
            row["seconds"] = cpu_seconds.get(position, gpu.get(position))
        return rows

    # -- reports ------------------------------------------------------------------------------

    def _graph(self, tokens: int | None, last_token: bool = False) -> _Graph:
        if tokens is None:
            tokens = self.program.tokens
        if tokens not in self._graphs:
            raise ValueError(f"{self.source}: no graph for {tokens} tokens a call; it has "
                             f"{', '.join(map(str, self.token_counts)) or 'static shapes'}")
        return self._last_graphs.get(tokens, self._graphs[tokens]) if last_token else self._graphs[tokens]

    def placement(self, tokens: int | None = None, last_token: bool = False) -> list[dict]:
        """One dict per node, in program order (of the graph for `tokens` tokens a call, for a
        dynamic token count; default: the smallest; `last_token`: the graph `last_token` runs
        for that count).

        Keys: ``node``, ``target``, ``runs_on`` ("vulkan" or "cpu"), ``op`` (what
        ran: for a dispatcher the op it routed to), ``variant`` (the variants it
        dispatched, joined by "+"), ``layout`` (of its packed int8 input as
        resolved on this device, or None), ``tuning`` (for a conv on the device:
        "measured: <choice>" when its settings come from the tuning cache (the
        measured choice of the algorithm it ran), else "rule"; None for other nodes) and ``reason`` (why it runs on the CPU;
        "" on the device).
        """
        return self._placement(self._graph(tokens, last_token))

    def _placement(self, graph: _Graph) -> list[dict]:
        rows = []
        for node, record in zip(graph.program.nodes, graph.recording.records, strict=True):
            packed = [graph.program.values[n].layout for n in node.reads()
                      if graph.program.values[n].layout is not None]
            ops = list(dict.fromkeys(op for op, _ in record.dispatches))
            on_device = record.runs_on == "vulkan"
            rows.append({
                "node": node.name, "target": node.target, "runs_on": record.runs_on,
                "op": (ops[-1] if ops else node.target) if on_device else node.target,
                "variant": "+".join(v for _, v in record.dispatches) or None,
                "layout": packed[0] if packed else None,
                "tuning": self._tuning(graph.program, node, ops[-1]) if on_device and ops else None,
                "reason": "" if on_device else record.reason,
            })
        return rows

    @staticmethod
    def _tuning(program: Program, node, op: str) -> str | None:
        """The `placement` ``tuning`` of a device node whose last dispatch was by `op`."""
        algorithm = CONV_OP_ALGORITHMS.get(op)
        if node.target not in CONV_OPS or algorithm is None:
            return None
        choice = tuning.lookup(conv_geometry(program, node), algorithm)
        return f"measured: {choice.label}" if choice else "rule"

    def memory_plan(self, tokens: int | None = None, last_token: bool = False) -> dict:
        """The intermediates' memory of the graph for `tokens` tokens a call (as `placement`):
        ``tensors``, ``unshared_bytes`` (each alone), ``planned_bytes`` (the shared buffers),
        ``buffers`` and ``peak_bytes`` (the most live at once, a lower bound); ``input_bytes``
        (the segments' input tensors). A last-token graph's buffers are its full graph's where
        they fit."""
        graph = self._graph(tokens, last_token)
        inputs = sum(t.memory.nbytes for s in graph.recording.segments for _, t in s.inputs
                     if t.memory is not None)
        plan = graph.plan
        return {"tensors": len(plan.slot_of), "unshared_bytes": plan.unshared_bytes,
                "planned_bytes": plan.planned_bytes, "buffers": len(plan.slot_bytes),
                "peak_bytes": plan.peak_bytes, "input_bytes": inputs}


class _GraphFallback(Exception):
    """A `Fallback` in the graph of key `key`: its tokens a call (None: the only graph), or
    ``("last", tokens)`` for a last-token graph."""

    def __init__(self, key, node: str, reason: str):
        super().__init__(key, node, reason)
        self.key, self.node, self.reason = key, node, reason


def _slot_buffers(device, sizes: list[int], spare) -> list[Buffer]:
    """A buffer for each planned slot of `sizes`: one of `spare` (another graph's slots, never in
    use while this graph runs) that holds it, the largest slots first, else a new one."""
    free = sorted(spare, key=lambda b: b.nbytes, reverse=True)
    buffers: list[Buffer | None] = [None] * len(sizes)
    for slot in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):
        buffers[slot] = free.pop(0) if free and free[0].nbytes >= sizes[slot] else Buffer(device, sizes[slot])
    return buffers


def _narrowed(value, tensor: Tensor, name: str, source: str):
    """`value`, checked to fit the int32 device tensor an int64 host value is uploaded to."""
    if value.dtype != torch.int64 or tensor.dtype != torch.int32 or not value.numel():
        return value
    low, high = value_range(integer_values(value))
    if low < -2**31 or high >= 2**31:
        raise ProgramInputError(f"{source}: value {name!r} holds integers outside int32, which the "
                                "device's int32 copy of it cannot hold")
    return value


def load(path, device=None, progress: Callable[[str], None] | None = None) -> LoadedProgram:
    """Reads a program file and loads it on `device` (default: ``ETVK_DEVICE``'s or the best one).

    Raises:
        runtime.programs.fileformat.ProgramFileError: the file and its fault.
    """
    return LoadedProgram(Program.load(path), device, str(path), progress)
