"""What the lowering's pattern rewrites share: bound arguments, int8 qparams, a graph's state.

`bind` names a node's arguments by its op's schema and `with_arguments` sets
some by name; `ints` reads aten's int[2]
arguments as lists; `int8_per_tensor` reads a
full-range int8 per-tensor (de)quantize with scalar qparams; `float_cast`
reads a cast between fp32 and fp16; `slice_range` reads the range a slice
takes of a last dimension; `conv_activation` reads an activation as the conv
ops' activation arguments; `Rewriter`
keeps a program's producer and user maps current while patterns replace
nodes, reads symmetric per-channel weights and finds the conv whose epilogue
may take one more step. Pure graph work, no Vulkan;
used by lower.py and the lower_*.py / split_linears.py pattern modules.
"""

from __future__ import annotations

import math

import torch

from runtime.families.conv2d_layouts import PLACEHOLDER
from runtime.programs.cpu import resolve_op
from runtime.programs.nodes import Const, Node, Ref, ValueSpec
from runtime.programs.program import Program

Q = "quantized_decomposed.quantize_per_tensor.default"
DQ = "quantized_decomposed.dequantize_per_tensor.default"
DQ_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
CONV = "etvk.q8ta_conv2d.default"
FLOATS = (torch.float32, torch.float16)  # the activation dtypes the float ops take
FLOAT_CASTS = ("aten._to_copy.default", "aten.to.dtype", "aten.type_as.default")  # what `float_cast` reads
# aten activation -> the conv ops' `activation` (hardtanh also takes its bounds)
ACTIVATIONS = {"aten.relu.default": "relu", "aten.hardtanh.default": "hardtanh",
               "aten.hardswish.default": "hardswish"}


def bind(node: Node) -> dict:
    """A node's arguments by schema name, defaults filled in."""
    bound = {}
    for index, arg in enumerate(resolve_op(node.target)._schema.arguments):
        if index < len(node.args) and not arg.kwarg_only:
            bound[arg.name] = node.args[index]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def with_arguments(node: Node, **values) -> tuple:
    """`node`'s positional arguments with `values` set by schema name; the arguments between
    its last one and the last one named take their schema defaults."""
    names = [a.name for a in resolve_op(node.target)._schema.arguments]
    bound = {**bind(node), **values}
    count = max(len(node.args), *(names.index(name) + 1 for name in values))
    return tuple(bound[name] for name in names[:count])


def ints(value) -> list[int]:
    """An int or a list of ints as a list (aten's int[2] arguments)."""
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def int8_per_tensor(node: Node | None, target: str):
    """(input, scale, zero point) of a full-range int8 per-tensor (de)quantize with scalar qparams."""
    if node is None or node.target != target:
        return None
    b = bind(node)
    scale, zero_point = b["scale"], b["zero_point"]
    if (b["quant_min"], b["quant_max"], b["dtype"]) != (-128, 127, torch.int8) \
            or b.get("out_dtype") not in (None, torch.float32) or not isinstance(b["input"], Ref) \
            or not isinstance(scale, float) or not (math.isfinite(scale) and scale > 0) \
            or not isinstance(zero_point, int) or not -128 <= zero_point <= 127:
        return None
    return b["input"], scale, zero_point


def float_cast(rw: Rewriter, node: Node | None) -> tuple[Ref, torch.dtype] | None:
    """(x, dtype) where `node` casts the value x between fp32 and fp16 (``_to_copy``,
    ``to.dtype`` or ``type_as`` to the other one of the two, nothing else asked); None for
    anything else."""
    if node is None or node.target not in FLOAT_CASTS:
        return None
    b = bind(node)
    x = b["self"]
    other = rw.value_spec(b.get("other"))  # type_as: the dtype of `other`
    dtype = b.get("dtype") if node.target != "aten.type_as.default" else other and other.dtype
    source = rw.program.values.get(x.name) if isinstance(x, Ref) else None
    if source is None or {source.dtype, dtype} != set(FLOATS) \
            or any(v not in (None, False) for k, v in b.items() if k not in ("self", "dtype", "copy", "other")):
        return None
    return x, dtype


def slice_range(node: Node, size: int, rank: int) -> tuple[int, int] | None:
    """(start, end) of the values an ``aten.slice.Tensor`` node takes along the last of `rank`
    dimensions, of `size` values (bounds as PyTorch reads them: None the ends, negative from the
    end, clamped to the dimension); None where it slices another dimension or steps by more than 1."""
    b = bind(node)
    if b["dim"] not in (rank - 1, -1) or b["step"] != 1:
        return None
    start, end = (b["start"] or 0), (size if b["end"] is None else b["end"])
    start, end = (v + size if v < 0 else v for v in (start, end))
    start = min(max(start, 0), size)
    return start, min(max(end, start), size)


def conv_activation(node: Node | None) -> tuple | None:
    """The conv ops' activation arguments for what `node` applies: ``("relu",)``,
    ``("hardswish",)`` or ``("hardtanh", min, max)``; None for another op or hardtanh bounds
    a conv cannot take (not finite, or min > max)."""
    if node is None or node.target not in ACTIVATIONS:
        return None
    if node.target != "aten.hardtanh.default":
        return (ACTIVATIONS[node.target],)
    b = bind(node)
    low, high = float(b["min_val"]), float(b["max_val"])
    return ("hardtanh", low, high) if math.isfinite(low) and math.isfinite(high) and low <= high else None


class Rewriter:
    """One program being rewritten, with its producer and user maps kept current."""

    def __init__(self, program: Program):
        self.program = program
        self.refresh()

    def refresh(self) -> None:
        self.producers = self.program.producers()
        self.users = self.program.users()

    def producer(self, ref) -> Node | None:
        return self.producers.get(ref.name) if isinstance(ref, Ref) else None

    def only_user(self, node: Node) -> Node | None:
        """The one node reading `node`'s first output, if it is one and not a program output."""
        out = node.outputs[0]
        users = self.users.get(out, [])
        return users[0] if len(users) == 1 and out not in self.program.outputs else None

    def plain_conv(self, value: Ref, reader: Node) -> Node | None:
        """The ``q8ta_conv2d`` that writes `value` where `reader` alone reads it, it is no
        program output, and the conv's epilogue takes neither a residual nor a table yet."""
        conv = self.producer(value)
        if conv is None or conv.target != CONV or conv.kwargs or self.users.get(value.name) != [reader] \
                or value.name in self.program.outputs:
            return None
        bound = bind(conv)
        return conv if bound["residual"] is None and bound["lut"] is None else None

    def dequantized(self, ref):
        """(int8 value, scale, zero point) where `ref` is an int8 per-tensor dequantize's output."""
        return int8_per_tensor(self.producer(ref), DQ)

    def requantized(self, node: Node):
        """(the quantize node, scale, zero point) where `node`'s only user quantizes it per tensor."""
        user = self.only_user(node)
        found = int8_per_tensor(user, Q)
        return None if found is None or found[0].name != node.outputs[0] else (user, found[1], found[2])

    def shape(self, ref) -> tuple[int, ...]:
        return self.program.values[ref.name].shape

    def value_spec(self, value) -> ValueSpec | None:
        """The shape and dtype of a value or constant argument; None for anything else."""
        if isinstance(value, Ref):
            return self.program.values[value.name]
        if isinstance(value, Const):
            tensor = self.program.constants[value.name]
            return ValueSpec(tuple(tensor.shape), tensor.dtype)
        return None

    def made_by(self, value, *targets: str) -> Node | None:
        """The node that makes `value`, if it calls one of `targets`."""
        node = self.producer(value)
        return node if node is not None and node.target in targets else None

    def replace_call(self, old: Node, target: str, args: tuple, kwargs: dict | None = None) -> Node:
        """`old` replaced by a call of `target` with the same outputs; returns the new node."""
        new = Node(f"{old.name}_etvk", target, args, kwargs or {}, old.outputs)
        self.replace(old, new)
        return new

    def add_constant(self, name: str, tensor: torch.Tensor) -> Const:
        while name in self.program.constants or name in self.program.values:
            name += "_"
        self.program.constants[name] = tensor
        return Const(name)

    def replace(self, old: Node, new: Node) -> None:
        self.program.nodes[self.program.nodes.index(old)] = new
        self.refresh()

    def mark_packed(self, name: str) -> None:
        spec = self.program.values[name]
        self.program.values[name] = ValueSpec(spec.shape, spec.dtype, PLACEHOLDER)

    def symmetric_weight(self, node: Node | None, dims: int):
        """(int8 weights, int32 sums, fp32 scales) constants of a symmetric per-channel int8
        weight of `dims` dimensions dequantized by `node`; None where it is not one."""
        if node is None or node.target != DQ_CHANNEL:
            return None
        b = bind(node)
        names = (b["input"], b["scales"], b["zero_points"])
        if not all(isinstance(c, Const) for c in names[:2]) or b["axis"] != 0 or b["dtype"] != torch.int8 \
                or b["quant_min"] < -127 or b["quant_max"] > 127 or b.get("out_dtype") not in (None, torch.float32):
            return None
        w, scales = (self.program.constants[c.name] for c in names[:2])
        zeros = None if names[2] is None else self.program.constants.get(getattr(names[2], "name", ""))
        if w.dtype != torch.int8 or w.dim() != dims or scales.numel() != w.shape[0] \
                or not bool(torch.isfinite(scales).all() and (scales.float() > 0).all()) \
                or (zeros is None) != (names[2] is None) or (zeros is not None and bool(zeros.any())):
            return None
        sums = self.add_constant(f"{names[0].name}_sums",
                                 w.to(torch.int32).sum(dim=tuple(range(1, dims)), dtype=torch.int32))
        fp32 = names[1] if scales.dtype == torch.float32 else \
            self.add_constant(f"{names[1].name}_fp32", scales.float())
        return names[0], sums, fp32

    def fp32_bias(self, bias):
        """`bias` (None or a float constant) as an fp32 constant; False where it is neither."""
        if bias is None:
            return None
        if not isinstance(bias, Const) or not self.program.constants[bias.name].dtype.is_floating_point:
            return False
        tensor = self.program.constants[bias.name]
        return bias if tensor.dtype == torch.float32 else self.add_constant(f"{bias.name}_fp32", tensor.float())
