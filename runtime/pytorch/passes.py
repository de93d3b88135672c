"""Graph passes over ``torch.export`` programs: FuseQuantizedOps.

`fuse_quantized_ops` rewrites ``dequantize(per-token int8 activations) +
dequantize(4-bit grouped weight constant) + aten.linear`` into one
``etvk.linear_qta8a_qga4w`` (OPS.md family 3): the weight constant is packed
by `runtime.families.int4.pack_int4` into new buffers and a bias stays a separate
``aten.add``. It recognises ``quantized_decomposed.dequantize_per_token`` /
``dequantize_per_channel_group`` and ``torchao.dequantize_affine`` (what
torchao's ``Int8DynActInt4WeightQuantizer`` and ``quantize_(m,
Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4))`` export), with
views/reshapes between the activation dequantize and the linear. Run it on
what ``torch.export.export`` returns (or after ``run_decompositions({})``).

It fuses only what it can prove equivalent (fp16 linears: the same quantized
math, see the last point) and logs (DEBUG) why it left the rest:

- Weight: a constant (parameter, buffer, lifted constant or a subclass's inner
  tensor) of integers with a declared range of at most 16 values, fp32 output
  (or fp16, below), groups along K that divide K and are a multiple of 8. Values and zero points
  shift by one integer ``c`` onto [-8, 7] (``c = 0`` for ranges inside [-8, 7],
  else ``quant_min + 8``: 8 for uint4 [0, 15] with zero point 8), and
  ``(w - c) - (z - c) = w - z``, so every dequantized weight is identical.
  Float zero points must be integers, scales fp32 values (fp64 only if exact).
- Activation: int8, range inside [-128, 127], fp32 output (or fp16, below),
  per token. Integer zero points the original keeps exact are cast to int32; int64 and float ones
  only when they come from a choose-qparams op (rounded, clamped to int8).
  fp64 scales are cast to fp32 (the fused op rounds the scale where the
  original rounded each dequantized value: the same 2**-24 bound); fp16/bf16
  scales only where the original promotes them exactly (torchao).
- Both dequantizes produce fp32, so the linear is fp32 like the fused op (no
  cast needed); or, for torchao's fp16 8da4w (``precision=torch.float16``:
  activations and weights dequantized to fp16 by ``dequantize_affine``, the
  linear in fp16), both produce fp16: the fused op's fp32 result (plus the
  bias, cast to fp32) is then cast to fp16 once (``aten._to_copy``). That is
  the same integer sums and scales without the fp16 rounding of each
  dequantized activation and weight that the original's fp16 operands
  carry, so the result is the closer one to the exact product of the
  quantized values; it is not bit-equal to the original (docs/llm_ops.md).
  bf16 models stay unfused.

Called by users and tests on exported programs; never touches Vulkan or the input program.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import operator
import warnings

import torch
from torch._guards import detect_fake_mode
from torch.export import ExportedProgram
from torch.export import graph_signature as sig
from torch.fx import Node

from runtime.families.int4 import pack_int4

logger = logging.getLogger(__name__)

_DEQUANT_PER_TOKEN = "quantized_decomposed::dequantize_per_token.default"
_DEQUANT_GROUP = "quantized_decomposed::dequantize_per_channel_group.default"
_DEQUANT_AFFINE = "torchao::dequantize_affine.default"
_CHOOSE_PER_TOKEN = "quantized_decomposed::choose_qparams_per_token_asymmetric.default"
_CHOOSE_AFFINE = "torchao::choose_qparams_affine.default"
_INNER_TENSOR = "export::access_subclass_inner_tensor.default"
_VIEWS = {"aten::view.default", "aten::reshape.default", "aten::_unsafe_view.default"}
_BOUNDS = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int4: (-8, 7), torch.uint4: (0, 15)}
_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
# Activation zero-point dtypes the original arithmetic keeps exact, per dequantize op
# (quantized_decomposed subtracts in the promoted integer type: int8 - int8 can overflow).
_EXACT_ZERO_POINTS = {
    _DEQUANT_PER_TOKEN: {torch.uint8, torch.int16, torch.int32},
    _DEQUANT_AFFINE: {torch.int8, torch.uint8, torch.int16},
}
# Activation scale dtypes each dequantize op promotes exactly to fp32 (fp64: see module docstring).
_SCALES = {_DEQUANT_PER_TOKEN: {torch.float32, torch.float64}, _DEQUANT_AFFINE: _FLOATS}
# The dtypes each dequantize op may produce for a fused linear (the linear's dtype).
_OUT_DTYPES = {_DEQUANT_PER_TOKEN: {torch.float32}, _DEQUANT_GROUP: {torch.float32},
               _DEQUANT_AFFINE: {torch.float32, torch.float16}}
_PERSISTENT_KINDS = (sig.InputKind.PARAMETER, sig.InputKind.BUFFER)
_CONSTANT_KINDS = (sig.InputKind.PARAMETER, sig.InputKind.BUFFER, sig.InputKind.CONSTANT_TENSOR)


class _Skip(Exception):
    """Why a linear stays unfused."""


@dataclasses.dataclass(frozen=True)
class _Activation:
    """A linear's quantized input: x_q, its per-token qparams, the views after dequantize."""

    q: Node
    scale: Node
    zero_point: Node
    views: tuple[Node, ...]
    flatten_qparams: bool


@dataclasses.dataclass(frozen=True)
class _Weight:
    """A weight constant in the op's format: packed uint8 [N, K/2], fp32 and int32 [N, G]."""

    packed: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    group_size: int
    source: str


def fuse_quantized_ops(program: ExportedProgram) -> ExportedProgram:
    """FuseQuantizedOps: int8-activation x 4-bit-weight linears become ``etvk.linear_qta8a_qga4w``.

    Args:
        program: a ``torch.export`` program; it is not modified.

    Returns:
        A new program in which every provably equivalent pattern is fused.
        The packed weights, scales and zeros are new buffers next to the
        module that owned the weight; weight constants left unused are dropped.

    Raises:
        RuntimeError: ``torch.ops.etvk.linear_qta8a_qga4w`` is not registered
            (``generated/`` has not been written: run ``make generate``).
    """
    if not hasattr(torch.ops.etvk, "linear_qta8a_qga4w"):
        raise RuntimeError("torch.ops.etvk.linear_qta8a_qga4w is not registered: run `make generate`")
    editor = _ProgramEditor(program)
    for node in list(editor.graph.nodes):
        if _op_name(node) == "aten::linear.default":
            try:
                _fuse_linear(editor, node)
            except _Skip as why:
                logger.debug("FuseQuantizedOps: %s stays unfused: %s", node.name, why)
    return editor.finish()


def _fuse_linear(editor: _ProgramEditor, linear: Node) -> None:
    """Replaces one linear, or raises `_Skip` before changing anything."""
    x_dq, w_dq = linear.args[0], linear.args[1]
    bias = linear.args[2] if len(linear.args) > 2 else linear.kwargs.get("bias")
    out_dtype = _dtype(linear)
    if out_dtype not in (torch.float32, torch.float16):
        raise _Skip(f"linear output is {out_dtype}, not float32 or float16")
    act = _activation(x_dq)
    weight, (packed, scales, zeros) = editor.weight(w_dq)
    with editor.graph.inserting_before(linear):
        x = act.q
        for view in act.views:
            x = editor.call(linear, view.target, (x, *view.args[1:]), view.kwargs)
        qparams = []
        for value, dtype in ((act.scale, torch.float32), (act.zero_point, torch.int32)):
            if _dtype(value) != dtype:
                value = editor.call(linear, torch.ops.aten._to_copy.default, (value,), {"dtype": dtype})
            if act.flatten_qparams:
                value = editor.call(linear, torch.ops.aten.reshape.default, (value, [-1]))
            qparams.append(value)
        fused_op = torch.ops.etvk.linear_qta8a_qga4w.default
        out = editor.call(linear, fused_op, (x, *qparams, packed, weight.group_size, scales, zeros))
        if bias is not None:
            if _dtype(bias) != torch.float32:  # the fp32 sum takes the bias exactly
                bias = editor.call(linear, torch.ops.aten._to_copy.default, (bias,), {"dtype": torch.float32})
            out = editor.call(linear, torch.ops.aten.add.Tensor, (out, bias))
        if out_dtype != torch.float32:
            out = editor.call(linear, torch.ops.aten._to_copy.default, (out,), {"dtype": out_dtype})
    linear.replace_all_uses_with(out)
    editor.erase_dead(linear)


def _activation(node: Node) -> _Activation:
    """Matches ``views(dequantize_per_token_int8(q, scale, zero_point))``."""
    views = []
    while _op_name(node) in _VIEWS:
        views.insert(0, node)
        node = node.args[0]
    name = _op_name(node)
    if name not in (_DEQUANT_PER_TOKEN, _DEQUANT_AFFINE):
        raise _Skip(f"linear input comes from {node.format_node()}, not a per-token dequantize")
    a = _bind(node)
    q = a["input"]
    shape = tuple(_val(q).shape)
    per_token = shape[:-1] + (1,)
    if name == _DEQUANT_PER_TOKEN:
        scale, zp, dtype, out_dtype = a["scales"], a["zero_points"], a["dtype"], a["output_dtype"]
        if tuple(_val(scale).shape) != per_token or tuple(_val(zp).shape) != per_token:
            raise _Skip("dequantize_per_token qparams are not of shape [..., 1]")
    else:
        scale, zp, dtype = a["scale"], a["zero_point"], a["input_dtype"]
        out_dtype = a.get("output_dtype", torch.float32)
        if list(a["block_size"]) != [1] * (len(shape) - 1) + [shape[-1]] or zp is None:
            raise _Skip(f"activation block size {a['block_size']} is not per token, or no zero point")
    flatten = bool(views) or tuple(_val(scale).shape) != per_token or tuple(_val(zp).shape) != per_token
    qmin, qmax = _quant_range(a, dtype)
    if dtype != torch.int8 or _dtype(q) != torch.int8 or qmin < -128 or qmax > 127:
        raise _Skip(f"activation is {_dtype(q)} declared {dtype} [{qmin}, {qmax}], not int8")
    if out_dtype not in _OUT_DTYPES[name] or _dtype(scale) not in _SCALES[name]:
        raise _Skip(f"activation dequantize to {out_dtype} with {_dtype(scale)} scales")
    if _dtype(zp) not in _EXACT_ZERO_POINTS[name] and not _small_integers(zp, node.graph.owning_module):
        raise _Skip(f"cannot prove the {_dtype(zp)} activation zero points are int8-range integers")
    if any(_val(v).shape[-1] != shape[-1] for v in views):
        raise _Skip("a view between dequantize and linear changes the last dimension")
    return _Activation(q, scale, zp, tuple(views), flatten)


def _small_integers(node: Node, module: torch.nn.Module) -> bool:
    """True if ``node`` is the zero-point output of a choose-qparams op with int8-range results.

    Those ops round and clamp zero points to the quant range, so any float or
    int16+ dtype holds them exactly; ``module`` owns ``node``'s graph.
    """
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    source, index = node.args
    if getattr(source, "target", None) is torch.ops.higher_order.wrap_with_set_grad_enabled:
        submodule = operator.attrgetter(source.args[1].target)(module)
        inner = next(n for n in submodule.graph.nodes if n.op == "output").args[0][index]
        return isinstance(inner, Node) and _small_integers(inner, submodule)
    if index != 1 or _dtype(node) not in _FLOATS | {torch.int16, torch.int32, torch.int64}:
        return False
    if _op_name(source) == _CHOOSE_PER_TOKEN:
        return True
    if _op_name(source) == _CHOOSE_AFFINE:
        bound = _bind(source)
        qmin, qmax = _quant_range(bound, bound["target_dtype"])
        return -128 <= qmin <= qmax <= 127
    return False


def _weight(editor: _ProgramEditor, node: Node) -> _Weight:
    """Reads a dequantized 4-bit weight constant and converts it to the op's format."""
    name = _op_name(node)
    if name not in (_DEQUANT_GROUP, _DEQUANT_AFFINE):
        raise _Skip(f"linear weight comes from {node.format_node()}, not a grouped dequantize")
    a = _bind(node)
    group = name == _DEQUANT_GROUP
    w, scales = editor.constant(a["input"]), editor.constant(a["scales" if group else "scale"])
    zp_node = a["zero_points" if group else "zero_point"]
    zp = torch.zeros((), dtype=torch.int32) if zp_node is None else editor.constant(zp_node)
    if w is None or scales is None or zp is None:
        raise _Skip("weight, scales or zero points are not constants")
    if w.dtype.is_floating_point or w.dim() != 2:
        raise _Skip(f"weight is {w.dtype} of shape {tuple(w.shape)}, not a 2-D integer tensor")
    n, k = w.shape
    if group:
        dtype, group_size, out_dtype = a["dtype"], a["group_size"], a["output_dtype"]
        if group_size > k and scales.shape[-1] == 1:
            group_size = k  # quantized_decomposed's single-group rule
        if torch.promote_types(w.dtype, zp.dtype) == torch.uint8:
            raise _Skip("uint8 weight minus uint8 zero point wraps in the original")
        if scales.dtype in (torch.float16, torch.bfloat16):
            raise _Skip("quantized_decomposed multiplies by fp16/bf16 scales in half precision")
    else:
        dtype, out_dtype, block = a["input_dtype"], a.get("output_dtype", torch.float32), a["block_size"]
        if len(block) != 2 or block[0] != 1:
            raise _Skip(f"weight block size {block} is not [1, group_size]")
        group_size = block[1]
    qmin, qmax = _quant_range(a, dtype)
    if out_dtype not in _OUT_DTYPES[name] or qmax - qmin > 15:
        raise _Skip(f"weight dequantize to {out_dtype} from range [{qmin}, {qmax}]")
    if group_size <= 0 or group_size % 8 or k % group_size:
        raise _Skip(f"group size {group_size} must divide K={k} and be a multiple of 8")
    groups = k // group_size
    if scales.numel() != n * groups or zp.numel() not in (1, n * groups):
        raise _Skip("scales or zero points do not hold one value per group")
    scales, zp = scales.reshape(n, groups), zp.reshape(-1).expand(n * groups).reshape(n, groups)
    if not scales.dtype.is_floating_point or not torch.equal(scales.float().double(), scales.double()):
        raise _Skip("weight scales are not fp32 values")
    if zp.dtype.is_floating_point and not torch.equal(zp, zp.round()):
        raise _Skip("float weight zero points are not integers")
    shift = 0 if -8 <= qmin and qmax <= 7 else qmin + 8
    wq, zq = w.to(torch.int64) - shift, zp.to(torch.int64) - shift
    for what, t in (("weights", wq), ("zero points", zq)):
        if t.numel() and (t.min() < -8 or t.max() > 7):
            raise _Skip(f"{what} minus {shift} leave [-8, 7]")
    packed = pack_int4(wq.to(torch.int8))
    return _Weight(packed, scales.float().contiguous(), zq.to(torch.int32), group_size, editor.target(a["input"]))


class _ProgramEditor:
    """A copy of a program's graph, signature, state dict and constants, edited in place."""

    def __init__(self, program: ExportedProgram):
        self.program = program
        self.module = copy.deepcopy(program.graph_module)
        self.graph = self.module.graph
        # The copy names its nodes anew, and a placeholder whose name Python or torch.fx
        # reserves (``input``, ``list``) gets a suffix: the specs follow the copy's names.
        names = {old.name: new.name for old, new in zip(
            program.graph.find_nodes(op="placeholder"), self.graph.find_nodes(op="placeholder"), strict=True)}
        self.specs = [_renamed(s, names) for s in program.graph_signature.input_specs]
        self.state_dict = dict(program.state_dict)
        self.constants = dict(program.constants)
        self.fake_mode = detect_fake_mode([n.meta.get("val") for n in self.graph.nodes])
        mutations = (sig.OutputKind.BUFFER_MUTATION, sig.OutputKind.PARAMETER_MUTATION)
        self.mutated = {s.target for s in program.graph_signature.output_specs if s.kind in mutations}
        self._weights: dict[str, tuple[_Weight, tuple[Node, Node, Node]]] = {}

    def spec(self, node: Node) -> sig.InputSpec | None:
        """The input spec of a placeholder."""
        return next((s for s in self.specs if getattr(s.arg, "name", None) == node.name), None)

    def target(self, node: Node) -> str:
        """The state-dict name behind a constant node (``""`` when it has none)."""
        node = node.args[0] if _op_name(node) == _INNER_TENSOR else node
        return getattr(self.spec(node), "target", None) or ""

    def constant(self, node: Node) -> torch.Tensor | None:
        """The tensor a node always holds, or None if it is not a constant."""
        value = None
        if node.op == "placeholder":
            spec = self.spec(node)
            if spec is not None and spec.kind in _CONSTANT_KINDS and spec.target not in self.mutated:
                value = self.state_dict.get(spec.target, self.constants.get(spec.target))
        elif node.op == "get_attr":
            value = operator.attrgetter(node.target)(self.module)
        elif _op_name(node) == _INNER_TENSOR:
            outer = self.constant(node.args[0])
            value = getattr(outer, node.args[1], None) if outer is not None else None
        return value.detach() if isinstance(value, torch.Tensor) else None

    def weight(self, node: Node) -> tuple[_Weight, tuple[Node, Node, Node]]:
        """`_weight` of a weight dequantize and its new buffers, made once per distinct call."""
        key = repr((node.target, node.args, node.kwargs))  # nodes repr as their unique names
        if key not in self._weights:
            weight = _weight(self, node)
            self._weights[key] = weight, tuple(
                self.add_buffer(f"{weight.source or 'weight'}_etvk_{what}", getattr(weight, what))
                for what in ("packed", "scales", "zeros")
            )
        return self._weights[key]

    def add_buffer(self, target: str, tensor: torch.Tensor) -> Node:
        """Adds a persistent buffer placeholder after the last parameter/buffer placeholder."""
        taken = set(self.state_dict) | set(self.constants) | {s.target for s in self.specs}
        unique, i = target, 0
        while unique in taken:
            i, unique = i + 1, f"{target}_{i + 1}"
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        last = max((i for i, s in enumerate(self.specs) if s.kind in _PERSISTENT_KINDS), default=-1)
        where = placeholders[last] if last >= 0 else None
        with self.graph.inserting_after(where) if where else self.graph.inserting_before(placeholders[0]):
            node = self.graph.placeholder("b_" + unique.replace(".", "_"))
        node.target = node.name
        node.meta["val"] = self.fake_mode.from_tensor(tensor, static_shapes=True)
        self.specs.insert(last + 1, sig.InputSpec(sig.InputKind.BUFFER, sig.TensorArgument(node.name), unique, True))
        self.state_dict[unique] = tensor
        return node

    def call(self, like: Node, target, args: tuple, kwargs: dict | None = None) -> Node:
        """Inserts ``target(*args, **kwargs)`` with its fake value and ``like``'s module stack."""
        node = self.graph.call_function(target, args, kwargs or {})
        fake_args, fake_kwargs = torch.fx.node.map_arg((args, kwargs or {}), lambda n: n.meta["val"])
        with self.fake_mode:
            node.meta["val"] = target(*fake_args, **fake_kwargs)
        node.meta.update({k: like.meta[k] for k in ("nn_module_stack", "stack_trace") if k in like.meta})
        return node

    def erase_dead(self, node: Node) -> None:
        """Erases ``node`` and, transitively, the inputs and constants only it used."""
        work = [node]
        while work:
            node = work.pop()
            if node.users:
                continue
            if node.op == "placeholder":
                spec = self.spec(node)
                if spec is None or spec.kind not in _CONSTANT_KINDS:
                    continue
                self.specs.remove(spec)
                if not any(s.target == spec.target for s in self.specs):
                    self.state_dict.pop(spec.target, None)
                    self.constants.pop(spec.target, None)
            elif node.op != "call_function" or node.is_impure():
                continue
            work.extend(n for n in node.all_input_nodes if n not in work)
            self.graph.erase_node(node)

    def finish(self) -> ExportedProgram:
        """The edited program, with output specs renamed to the nodes that now produce them."""
        outputs = next(n for n in self.graph.nodes if n.op == "output").args[0]
        out_specs = [
            dataclasses.replace(s, arg=sig.TensorArgument(o.name)) if isinstance(s.arg, sig.TensorArgument) else s
            for s, o in zip(self.program.graph_signature.output_specs, outputs, strict=True)
        ]
        self.module.recompile()
        with warnings.catch_warnings():  # torch's own TreeSpec deep copy warns about LeafSpec
            warnings.filterwarnings("ignore", r".isinstance\(treespec, LeafSpec\)", FutureWarning)
            call_graph = copy.deepcopy(self.program.module_call_graph)
        return ExportedProgram(
            root=self.module,
            graph=self.graph,
            graph_signature=sig.ExportGraphSignature(self.specs, out_specs),
            state_dict=self.state_dict,
            range_constraints=copy.deepcopy(self.program.range_constraints),
            module_call_graph=call_graph,
            example_inputs=self.program.example_inputs,
            constants=self.constants,
            verifiers=self.program.verifiers,
        )


def _renamed(spec: sig.InputSpec, names: dict[str, str]) -> sig.InputSpec:
    """`spec` naming its placeholder as `names` maps it (arguments without a name stay)."""
    name = getattr(spec.arg, "name", None)
    if name is None or names.get(name, name) == name:
        return spec
    return dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name=names[name]))


def _op_name(node: object) -> str | None:
    """``"namespace::op.overload"`` of an op-overload call, else None."""
    target = getattr(node, "target", None)
    if isinstance(node, Node) and node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    return None


def _bind(node: Node) -> dict:
    """A call's arguments by schema name (omitted defaults are absent)."""
    bound = dict(node.kwargs)
    bound.update((arg.name, value) for arg, value in zip(node.target._schema.arguments, node.args, strict=False))
    return bound


def _quant_range(bound: dict, dtype: torch.dtype) -> tuple[int, int]:
    """(quant_min, quant_max), with None meaning the bounds of ``dtype``."""
    lo, hi = bound.get("quant_min"), bound.get("quant_max")
    if (lo is None or hi is None) and dtype not in _BOUNDS:
        raise _Skip(f"no default quant range for {dtype}")
    return (_BOUNDS[dtype][0] if lo is None else lo), (_BOUNDS[dtype][1] if hi is None else hi)


def _val(node: Node) -> torch.Tensor:
    """The fake tensor export recorded for a node (`_Skip` if none)."""
    if not isinstance(value := getattr(node, "meta", {}).get("val"), torch.Tensor):
        raise _Skip(f"{node} has no tensor metadata")
    return value


def _dtype(node: Node) -> torch.dtype:
    """The dtype export recorded for a node."""
    return _val(node).dtype
