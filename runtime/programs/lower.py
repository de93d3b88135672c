"""`runtime.lower`: a quantized ``torch.export`` program -> a device-independent `Program`.

Input: a program quantized with PT2E (static per-tensor int8 activations,
per-channel symmetric int8 weights, as XNNPACKQuantizer's symmetric config
makes them) and/or torchao's 8da4w linears. The steps:

1. `runtime.pytorch.passes.fuse_quantized_ops` fuses the 8da4w linears;
2. from_export.py converts the graph op for op;
3. ``dequantize_per_tensor -> aten.conv2d -> [relu] -> quantize_per_tensor``
   becomes one ``etvk.q8ta_conv2d`` (weight sums, fp32 weight scales and an
   fp32 bias computed once from the constants); its int8 input and output get
   the layout placeholder ``PACKED_INT8_CONV2D``;
4. the remaining quantize / dequantize / choose-qparams ops become their
   ``etvk`` twins: a 4-D int8 per-tensor quantize becomes ``q8ta_quantize``
   (packed, placeholder layout) and the dequantize of a packed tensor
   ``q8ta_dequantize``; a cast to the dtype a tensor already has is dropped;
5. what nothing reads is dropped.

What matches no pattern stays a PyTorch op: the loader runs it on the CPU.
A pattern is only rewritten where the result is provably the op's contract
(int8 range, symmetric weights, scalar qparams, one consumer in the chain).
Never touches Vulkan. Called by users (`runtime.lower`) and the tools.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch.export import ExportedProgram

from runtime.families.conv2d_layouts import PLACEHOLDER
from runtime.ops.library import MANIFEST, builtin_dir
from runtime.ops.registry import get_op
from runtime.programs.cpu import resolve_op
from runtime.programs.from_export import from_exported
from runtime.programs.nodes import Const, Node, Ref, ValueSpec
from runtime.programs.program import Program
from runtime.pytorch.passes import fuse_quantized_ops

_Q = "quantized_decomposed.quantize_per_tensor.default"
_DQ = "quantized_decomposed.dequantize_per_tensor.default"
_DQ_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"
_CONV = "aten.conv2d.default"
_ACTIVATIONS = {"aten.relu.default": "relu"}
# quantized_decomposed ops whose etvk twin has the same schema: (etvk target, output dtypes).
_TWINS = {
    "quantized_decomposed.quantize_per_token.default": ("etvk.quantize_per_token.default", None),
    "quantized_decomposed.dequantize_per_token.default": ("etvk.dequantize_per_token.default", None),
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": (
        "etvk.choose_qparams_per_token_asymmetric.default", (torch.float32, torch.int32)),
}
_FLOATS = (torch.float32, torch.float16)
# cast target -> the arguments it may have (input, dtype, copy); any other must be default
_CASTS = {"aten._to_copy.default": ("self", "dtype"), "aten.to.dtype": ("self", "dtype", "copy")}


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


def _int8_per_tensor(node: Node | None, target: str):
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


class _Lowering:
    """One program being rewritten, with its producer and user maps kept current."""

    def __init__(self, program: Program):
        self.program = program
        self._refresh()

    def _refresh(self) -> None:
        self.producers = self.program.producers()
        self.users = self.program.users()

    def producer(self, ref) -> Node | None:
        return self.producers.get(ref.name) if isinstance(ref, Ref) else None

    def only_user(self, node: Node) -> Node | None:
        out = node.outputs[0]
        users = self.users.get(out, [])
        return users[0] if len(users) == 1 and out not in self.program.outputs else None

    def add_constant(self, name: str, tensor: torch.Tensor) -> Const:
        while name in self.program.constants or name in self.program.values:
            name += "_"
        self.program.constants[name] = tensor
        return Const(name)

    def replace(self, old: Node, new: Node) -> None:
        self.program.nodes[self.program.nodes.index(old)] = new
        self._refresh()

    # -- conv -------------------------------------------------------------------------------

    def fuse_conv(self, conv: Node) -> bool:
        """``dq -> conv2d -> [relu] -> q`` -> ``etvk.q8ta_conv2d``; False where it does not match."""
        b = bind(conv)
        x = _int8_per_tensor(self.producer(b["input"]), _DQ)
        weight = self._weight(self.producer(b["weight"]))
        bias = b["bias"]
        if x is None or weight is None or len(self.program.values[x[0].name].shape) != 4:
            return False
        if bias is not None and not (isinstance(bias, Const) and self.program.constants[bias.name]
                                     .dtype.is_floating_point):
            return False
        activation, last = "none", conv
        user = self.only_user(conv)
        if user is not None and user.target in _ACTIVATIONS:
            activation, last, user = _ACTIVATIONS[user.target], user, self.only_user(user)
        out = _int8_per_tensor(user, _Q)
        if out is None or out[0].name != last.outputs[0]:
            return False
        wq, sums, scales = weight
        if bias is not None and self.program.constants[bias.name].dtype != torch.float32:
            bias = self.add_constant(f"{bias.name}_fp32", self.program.constants[bias.name].float())
        args = (x[0], x[1], x[2], wq, sums, scales, out[1], out[2], bias,
                list(self.program.constants[wq.name].shape[2:]), list(b["stride"]), list(b["padding"]),
                list(b["dilation"]), b["groups"], activation)
        fused = Node(f"{conv.name}_q8ta", "etvk.q8ta_conv2d.default", args, {}, user.outputs)
        for name in (x[0].name, user.outputs[0]):
            self._mark_packed(name)
        self.replace(user, fused)
        return True

    def _weight(self, node: Node | None):
        """(int8 weights, int32 sums, fp32 scales) constants of a symmetric per-channel weight."""
        if node is None or node.target != _DQ_CHANNEL:
            return None
        b = bind(node)
        names = (b["input"], b["scales"], b["zero_points"])
        if not all(isinstance(c, Const) for c in names[:2]) or b["axis"] != 0 or b["dtype"] != torch.int8 \
                or b["quant_min"] < -127 or b["quant_max"] > 127 or b.get("out_dtype") not in (None, torch.float32):
            return None
        w, scales = (self.program.constants[c.name] for c in names[:2])
        zeros = None if names[2] is None else self.program.constants.get(getattr(names[2], "name", ""))
        if w.dtype != torch.int8 or w.dim() != 4 or scales.numel() != w.shape[0] \
                or not bool(torch.isfinite(scales).all() and (scales.float() > 0).all()) \
                or (zeros is None) != (names[2] is None) or (zeros is not None and bool(zeros.any())):
            return None
        sums = self.add_constant(f"{names[0].name}_sums", w.to(torch.int32).sum(dim=(1, 2, 3),
                                                                                 dtype=torch.int32))
        fp32 = names[1] if scales.dtype == torch.float32 else \
            self.add_constant(f"{names[1].name}_fp32", scales.float())
        return names[0], sums, fp32

    def _mark_packed(self, name: str) -> None:
        spec = self.program.values[name]
        self.program.values[name] = ValueSpec(spec.shape, spec.dtype, PLACEHOLDER)

    # -- quantize edges ---------------------------------------------------------------------

    def lower_quantize_ops(self) -> None:
        """The remaining (de)quantize and choose-qparams ops become etvk ops where they fit."""
        for node in list(self.program.nodes):
            new = self._edge(node)
            if new is not None:
                self.replace(node, new)

    def _edge(self, node: Node) -> Node | None:
        values = self.program.values
        if node.target == _Q:
            b = bind(node)
            source = values.get(getattr(b["input"], "name", ""))
            if source is None or source.dtype not in _FLOATS or b["dtype"] not in (torch.int8, torch.uint8,
                                                                                   torch.int32):
                return None
            if _int8_per_tensor(node, _Q) is not None and len(source.shape) == 4:
                self._mark_packed(node.outputs[0])
                return Node(node.name, "etvk.q8ta_quantize.default",
                            (b["input"], b["scale"], b["zero_point"], PLACEHOLDER), {}, node.outputs)
            return dataclass_copy(node, "etvk.quantize_per_tensor.default")
        if node.target == _DQ:
            b = bind(node)
            source = values.get(getattr(b["input"], "name", ""))
            if source is None or b.get("out_dtype") not in (None, *_FLOATS):
                return None
            if source.layout is not None and _int8_per_tensor(node, _DQ) is not None:
                return Node(node.name, "etvk.q8ta_dequantize.default",
                            (b["input"], b["scale"], b["zero_point"], None), {}, node.outputs)
            if source.dtype in (torch.int8, torch.uint8, torch.int32):
                return dataclass_copy(node, "etvk.dequantize_per_tensor.default")
            return None
        if node.target in _TWINS:
            target, dtypes = _TWINS[node.target]
            if dtypes is not None:
                for name, dtype in zip(node.outputs, dtypes, strict=True):
                    values[name] = ValueSpec(values[name].shape, dtype, values[name].layout)
            return dataclass_copy(node, target)
        return None

    def drop_identity_casts(self) -> None:
        """A cast (``_to_copy`` / ``to``) of a tensor to the dtype it already has, with nothing else
        asked, goes: in a functional graph its result is the same values."""
        for node in list(self.program.nodes):
            if node.target not in _CASTS:
                continue
            b = bind(node)
            source = self.program.values.get(getattr(b.get(_CASTS[node.target][0]), "name", ""))
            extras = {k: v for k, v in b.items() if k not in _CASTS[node.target]}
            if source is not None and b.get("dtype") in (None, source.dtype) \
                    and all(v in (None, False) for v in extras.values()):
                self.program.replace_uses(node.outputs[0], node.args[0].name)
                self.program.nodes.remove(node)
                self._refresh()


def dataclass_copy(node: Node, target: str) -> Node:
    """`node` calling `target` instead (same arguments)."""
    return Node(node.name, target, node.args, dict(node.kwargs), node.outputs)


def manifest_hash() -> str:
    """sha256 of the built-in manifest (what a program records it was lowered with)."""
    return hashlib.sha256((builtin_dir() / MANIFEST).read_bytes()).hexdigest()


def lower(exported: ExportedProgram) -> Program:
    """Lowers a quantized ``torch.export`` program (see the module docstring).

    Args:
        exported: what ``torch.export.export`` returned for the quantized model.

    Returns:
        The `Program`; ``program.save(path)`` writes it.

    Raises:
        runtime.programs.from_export.LoweringError: the program holds something a
            runtime program cannot (dynamic shapes, mutations, higher-order ops).
    """
    program = from_exported(fuse_quantized_ops(exported))
    lowering = _Lowering(program)
    for node in list(program.nodes):
        if node.target == _CONV and node in program.nodes:
            lowering.fuse_conv(node)
    program.remove_dead()
    lowering._refresh()
    lowering.drop_identity_casts()
    lowering.lower_quantize_ops()
    program.remove_dead()
    program.op_schemas = {n.target: get_op(n.target).schema for n in program.nodes if n.is_etvk}
    program.manifest_hash = manifest_hash()
    return program
