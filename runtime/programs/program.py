"""`Program`: a lowered model, device-independent.

What `runtime.lower` returns and `Program.save` writes: inputs and outputs
(value names), nodes in execution order (each a call of one op: an ``etvk``
op or a PyTorch op that runs on the CPU), the shape, dtype and layout of
every value, and the constant tensors the nodes read (runtime.programs.nodes
defines the records). A program may have state (a decoder's KV cache):
values that live across calls, read by the nodes like inputs, each with
its start (zeros, or a constant) and the value it becomes at the end of a
call; the nodes stay functional. A decoder exported with a dynamic token
count holds the graph of its smallest count (one token: decode) and, in
`specializations`, those of larger counts, sharing its constants and state
(runtime.programs.token_counts). It must not touch Vulkan or choose devices (loader.py
does). Used by the lowering, the file format's callers, the loader and tools.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from runtime.programs import fileformat
from runtime.programs.chunking import join_outputs, split_call
from runtime.programs.cpu import run_on_cpu
from runtime.programs.layouts import resolve_layouts
from runtime.programs.nodes import Const, InputCheck, Node, Ref, ValueSpec, map_args


@dataclass
class Program:
    """A lowered model: see the module docstring.

    Attributes:
        inputs: the user input value names, in call order.
        outputs: the output value names, in return order.
        output_tuple: whether the model returns a tuple (else one tensor).
        nodes: the op calls in execution order.
        values: every value's `ValueSpec` (inputs and node outputs).
        constants: constant name -> CPU tensor.
        op_schemas: schema of every ``etvk`` op the nodes call (checked at load).
        manifest_hash: sha256 of the built-in manifest the program was lowered with.
        lowered_with: library -> version of those that made the graph (torch, and torchao
            where installed): PT2E's graphs differ between them (torch 2.11 leaves a
            squeeze-and-excite gate's pool unquantized, 2.13 does not); empty for a file
            from before.
        state: state value name -> the constant it starts as, or None for zeros.
        state_updates: state value name -> the value it becomes when a call ends.
        input_checks: what each input's values must satisfy before a call (`InputCheck`).
        token_inputs: for a dynamic token count, each input that holds the tokens of a
            call -> the dimension that counts them (empty: static shapes).
        token_outputs: for a dynamic token count, each output's token dimension (None: an
            output that does not grow with the tokens; the last chunk's is returned).
        specializations: token count -> the program's graph for that many tokens a call
            (its other fields as here, with no specializations; it shares `constants`,
            `state`, `token_inputs` and `token_outputs`).
    """

    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    values: dict[str, ValueSpec]
    constants: dict[str, torch.Tensor]
    output_tuple: bool = False
    op_schemas: dict[str, str] = field(default_factory=dict)
    manifest_hash: str = ""
    lowered_with: dict[str, str] = field(default_factory=dict)
    state: dict[str, str | None] = field(default_factory=dict)
    state_updates: dict[str, str] = field(default_factory=dict)
    input_checks: list[InputCheck] = field(default_factory=list)
    token_inputs: dict[str, int] = field(default_factory=dict)
    token_outputs: list[int | None] = field(default_factory=list)
    specializations: dict[int, Program] = field(default_factory=dict)

    @property
    def tokens(self) -> int | None:
        """The tokens of a call of this graph, for a dynamic token count; else None."""
        if not self.token_inputs:
            return None
        name, dim = next(iter(self.token_inputs.items()))
        return self.values[name].shape[dim]

    def producers(self) -> dict[str, Node]:
        """Value name -> the node that writes it (inputs have none)."""
        return {out: node for node in self.nodes for out in node.outputs}

    def users(self) -> dict[str, list[Node]]:
        """Value name -> the nodes that read it, in order (each node once)."""
        found: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in dict.fromkeys(node.reads()):
                found.setdefault(name, []).append(node)
        return found

    def replace_uses(self, old: str, new: str) -> None:
        """Every read of value `old` (and output of the program) reads `new` instead."""
        def swap(a):
            return Ref(new) if isinstance(a, Ref) and a.name == old else a

        for node in self.nodes:
            node.args, node.kwargs = map_args(node.args, swap), map_args(node.kwargs, swap)
        self.outputs = [new if name == old else name for name in self.outputs]

    def remove_dead(self) -> None:
        """Drops state that no node reads, nodes whose outputs nobody reads (the state
        updates count as read), and values and constants that nothing uses."""
        read = {r for n in self.nodes for r in n.reads()} | set(self.outputs)
        self.state = {k: v for k, v in self.state.items() if k in read}
        self.state_updates = {k: v for k, v in self.state_updates.items() if k in self.state}
        live = set(self.outputs) | set(self.state_updates.values())
        kept = []
        for node in reversed(self.nodes):
            if live & set(node.outputs):
                kept.append(node)
                live |= set(node.reads())
        self.nodes = kept[::-1]
        used_values = set(self.inputs) | set(self.state) | {o for n in self.nodes for o in n.outputs}
        self.values = {k: v for k, v in self.values.items() if k in used_values}
        used = {c for n in self.nodes for c in n.constants()} | {c for c in self.state.values() if c}
        self.constants = {k: v for k, v in self.constants.items() if k in used}

    def rename_constants(self, names: dict[str, str]) -> None:
        """Every read of each constant `old` of `names` reads constant ``names[old]`` instead."""
        def swap(a):
            return Const(names[a.name]) if isinstance(a, Const) and a.name in names else a

        for node in self.nodes:
            node.args, node.kwargs = map_args(node.args, swap), map_args(node.kwargs, swap)
        self.outputs = [names.get(name, name) if name not in self.values else name for name in self.outputs]

    def copy(self) -> Program:
        """A copy whose nodes and tables can be edited without touching this one (tensors shared;
        its specializations share its new tables of constants and state)."""
        copied = dataclasses.replace(
            self, inputs=list(self.inputs), outputs=list(self.outputs),
            nodes=[dataclasses.replace(n, kwargs=dict(n.kwargs)) for n in self.nodes],
            values=dict(self.values), constants=dict(self.constants), op_schemas=dict(self.op_schemas),
            state=dict(self.state), state_updates=dict(self.state_updates),
            input_checks=list(self.input_checks), token_inputs=dict(self.token_inputs),
            token_outputs=list(self.token_outputs), specializations={})
        for size, program in self.specializations.items():
            twin = program.copy()
            twin.constants, twin.state = copied.constants, copied.state
            copied.specializations[size] = twin
        return copied

    def save(self, path) -> None:
        """Writes the program to one file (`runtime.programs.fileformat`)."""
        fileformat.write_program(self, path)

    @classmethod
    def load(cls, path) -> Program:
        """Reads a program written by `save`, checking it (no device involved).

        Raises:
            runtime.programs.fileformat.ProgramFileError: the file and its fault.
        """
        fields = fileformat.read_program(path)
        fields["specializations"] = {
            size: cls(**f, token_inputs=fields["token_inputs"], token_outputs=fields["token_outputs"])
            for size, f in fields["specializations"].items()}
        return cls(**fields)

    def initial_state(self) -> dict[str, torch.Tensor]:
        """Each state value as a call first sees it: new CPU tensors (zeros, or its constant)."""
        return {name: self.initial_value(name) for name in self.state}

    def initial_value(self, name: str) -> torch.Tensor:
        """State value `name` as a call first sees it: a new CPU tensor (zeros, or its constant)."""
        start = self.state[name]
        return self.constants[start].clone() if start else \
            torch.zeros(self.values[name].shape, dtype=self.values[name].dtype)

    def run_reference(self, *inputs, state: dict[str, torch.Tensor] | None = None):
        """Runs every node on the CPU: etvk ops with their reference kernels (``torch.ops.etvk``).

        The definition a loaded program's results are bit-exact against. A program with a
        dynamic token count takes any count of tokens, in chunks as a loaded program runs them.

        Args:
            inputs: the program's inputs, in order.
            state: for a program with state, the state to start from, updated in place
                as a loaded program's is (`initial_state` makes one); None: a fresh one.
        """
        name, dim = next(iter(self.token_inputs.items()), (None, 0))
        ids = inputs[self.inputs.index(name)] if name and len(inputs) == len(self.inputs) else None
        if not isinstance(ids, torch.Tensor) or ids.dim() <= dim:  # static shapes, or a bad call
            return run_on_cpu(resolve_layouts(self, "other"), inputs, state)  # (refused there)
        state = self.initial_state() if state is None else state
        graphs = {self.tokens: self, **self.specializations}
        return join_outputs(self, [run_on_cpu(resolve_layouts(graphs[size], "other"), part, state)
                                   for size, part in split_call(self, inputs, ids.shape[dim])])
