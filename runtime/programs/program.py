"""`Program`: a lowered model, device-independent.

What `runtime.lower` returns and `Program.save` writes: inputs and outputs
(value names), nodes in execution order (each a call of one op: an ``etvk``
op or a PyTorch op that runs on the CPU), the shape, dtype and layout of
every value, and the constant tensors the nodes read (runtime.programs.nodes
defines the records). It must not touch Vulkan or choose devices (loader.py
does). Used by the lowering, the file format's callers, the loader and tools.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from runtime.programs import fileformat
from runtime.programs.cpu import run_on_cpu
from runtime.programs.layouts import resolve_layouts
from runtime.programs.nodes import Node, Ref, ValueSpec, map_args


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
    """

    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    values: dict[str, ValueSpec]
    constants: dict[str, torch.Tensor]
    output_tuple: bool = False
    op_schemas: dict[str, str] = field(default_factory=dict)
    manifest_hash: str = ""

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
        """Drops nodes whose outputs nobody reads, and values and constants nothing uses."""
        live = set(self.outputs)
        kept = []
        for node in reversed(self.nodes):
            if live & set(node.outputs):
                kept.append(node)
                live |= set(node.reads())
        self.nodes = kept[::-1]
        used_values = set(self.inputs) | {o for n in self.nodes for o in n.outputs}
        self.values = {k: v for k, v in self.values.items() if k in used_values}
        used = {c for n in self.nodes for c in n.constants()}
        self.constants = {k: v for k, v in self.constants.items() if k in used}

    def copy(self) -> Program:
        """A copy whose nodes and tables can be edited without touching this one (tensors shared)."""
        return dataclasses.replace(
            self, inputs=list(self.inputs), outputs=list(self.outputs),
            nodes=[dataclasses.replace(n, kwargs=dict(n.kwargs)) for n in self.nodes],
            values=dict(self.values), constants=dict(self.constants), op_schemas=dict(self.op_schemas))

    def save(self, path) -> None:
        """Writes the program to one file (`runtime.programs.fileformat`)."""
        fileformat.write_program(self, path)

    @classmethod
    def load(cls, path) -> Program:
        """Reads a program written by `save`, checking it (no device involved).

        Raises:
            runtime.programs.fileformat.ProgramFileError: the file and its fault.
        """
        return cls(**fileformat.read_program(path))

    def run_reference(self, *inputs):
        """Runs every node on the CPU: etvk ops with their reference kernels (``torch.ops.etvk``).

        The definition a loaded program's results are bit-exact against.
        """
        return run_on_cpu(resolve_layouts(self, "other"), inputs)
