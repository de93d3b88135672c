"""A ``torch.export`` program as a `Program`: the same graph, op for op.

Parameters, buffers and lifted constants become the program's constants
(named after their placeholders); user inputs and outputs keep their
order; every ``call_function`` of an op overload becomes a `Node` whose
target is ``"<namespace>.<op>.<overload>"``, a tuple result's ``getitem``
users naming its outputs (an op that returns nothing, such as an assertion,
has none and is dropped later as unused); in-place ``aten`` ops whose mutated input nobody
reads later become their functional twins. What a program cannot hold is
refused with a `LoweringError` naming the node: dynamic shapes, buffer
mutations, higher-order ops (but ``wrap_with_set_grad_enabled``, whose body
is inlined: grad mode does not matter to inference), arguments of other
types. Patterns are
rewritten afterwards (lower.py). Never touches Vulkan. Used by lower.py.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram
from torch.export import graph_signature as sig
from torch.fx import Node as FxNode

from runtime.errors import EtvkError
from runtime.programs.nodes import Const, Node, Ref, ValueSpec
from runtime.programs.program import Program

_CONSTANT_KINDS = (sig.InputKind.PARAMETER, sig.InputKind.BUFFER, sig.InputKind.CONSTANT_TENSOR)
_PLAIN = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class LoweringError(EtvkError, ValueError):
    """A ``torch.export`` program that cannot become a runtime program; names the node and why."""


def target_name(target) -> str | None:
    """``"aten.conv2d.default"`` for an op overload, None for anything else."""
    if isinstance(target, torch._ops.OpOverload):
        namespace, name = target._schema.name.split("::")
        return f"{namespace}.{name}.{target._overloadname}"
    return None


def _spec(node: FxNode, value) -> ValueSpec:
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"node {node.name}: its value is {type(value).__name__}, not a tensor")
    shape = []
    for size in value.shape:
        if not isinstance(size, int):
            raise LoweringError(f"node {node.name}: dynamic shape {list(value.shape)}; export the model "
                                "with static shapes")
        shape.append(size)
    return ValueSpec(tuple(shape), value.dtype)


def from_exported(exported: ExportedProgram) -> Program:
    """Converts `exported` op for op (see the module docstring).

    Raises:
        LoweringError: the program holds something a runtime program cannot.
    """
    signature = exported.graph_signature
    mutations = [s for s in signature.output_specs if s.kind != sig.OutputKind.USER_OUTPUT]
    if mutations:
        raise LoweringError(f"the program mutates {', '.join(str(s.target) for s in mutations)}; "
                            "programs with buffer or parameter mutations are not supported")
    kinds = {s.arg.name: s for s in signature.input_specs if isinstance(s.arg, sig.TensorArgument)}
    program = Program(inputs=[], outputs=[], nodes=[], values={}, constants={})
    refs: dict[str, object] = {}  # fx node name -> Ref / Const
    for fx in exported.graph.nodes:
        if fx.op == "placeholder":
            spec = kinds.get(fx.name)
            if spec is None or spec.kind not in (*_CONSTANT_KINDS, sig.InputKind.USER_INPUT):
                raise LoweringError(f"input {fx.name}: inputs of kind "
                                    f"{getattr(spec, 'kind', 'unknown')} are not supported")
            if spec.kind == sig.InputKind.USER_INPUT:
                program.inputs.append(fx.name)
                program.values[fx.name] = _spec(fx, fx.meta.get("val"))
                refs[fx.name] = Ref(fx.name)
            else:
                tensor = exported.state_dict.get(spec.target, exported.constants.get(spec.target))
                program.constants[fx.name] = tensor.detach()
                refs[fx.name] = Const(fx.name)
        elif fx.op in ("get_attr", "call_function"):
            _call(fx, refs, program, exported.graph_module, "")
        elif fx.op == "output":
            for out in fx.args[0]:
                if not isinstance(out, FxNode):
                    raise LoweringError(f"output {out!r} is not a tensor of the graph")
                program.outputs.append(refs[out.name].name)
            # A model that returns one tensor gets one back; any other structure, a tuple.
            program.output_tuple = not exported.call_spec.out_spec.is_leaf()
        else:
            raise LoweringError(f"node {fx.name}: {fx.op} nodes are not supported")
    _functionalize(program)
    return program


def _call(fx: FxNode, refs: dict, program: Program, module: torch.nn.Module, prefix: str) -> None:
    """Converts one get_attr or call_function node of `module`'s graph into `program`."""
    if fx.op == "get_attr":
        value = operator.attrgetter(fx.target)(module)
        if isinstance(value, torch.fx.GraphModule):
            refs[fx.name] = value  # the body of a higher-order op, inlined where it is called
        elif isinstance(value, torch.Tensor):
            program.constants[prefix + fx.name] = value.detach()
            refs[fx.name] = Const(prefix + fx.name)
        else:
            raise LoweringError(f"node {fx.name}: attribute {fx.target} is not a tensor")
    elif fx.target is operator.getitem:
        if fx.args[0].name in refs and isinstance(refs[fx.args[0].name], tuple):
            refs[fx.name] = refs[fx.args[0].name][fx.args[1]]  # an inlined body's result
    elif fx.target is torch.ops.higher_order.wrap_with_set_grad_enabled:
        _inline(fx, refs, program, prefix)
    else:
        program.nodes.append(_node(fx, refs, program, prefix))


def _inline(fx: FxNode, refs: dict, program: Program, prefix: str) -> None:
    """``wrap_with_set_grad_enabled(enabled, body, *operands)``: the body's nodes in place (grad
    mode is irrelevant to inference); its results name the call's ``getitem`` users."""
    body = refs[fx.args[1].name]
    inner: dict[str, object] = {}
    operands = iter(fx.args[2:])
    inner_prefix = f"{prefix}{fx.name}__"
    for node in body.graph.nodes:
        if node.op == "placeholder":
            inner[node.name] = refs[next(operands).name]
        elif node.op == "output":
            results = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
            refs[fx.name] = tuple(inner[r.name] for r in results)
        else:
            _call(node, inner, program, body, inner_prefix)


def _node(fx: FxNode, refs: dict, program: Program, prefix: str = "") -> Node:
    target = target_name(fx.target)
    if target is None:
        raise LoweringError(f"node {fx.name}: {fx.target} is not an op overload (higher-order ops "
                            "other than wrap_with_set_grad_enabled, and Python functions, are not "
                            "supported)")

    def convert(value):
        if isinstance(value, FxNode):
            return refs[value.name]
        if isinstance(value, (list, tuple)):
            return [convert(v) for v in value]
        if isinstance(value, _PLAIN):
            return value
        raise LoweringError(f"node {fx.name}: argument {value!r} ({type(value).__name__}) "
                            "is not supported")

    value = fx.meta.get("val")
    if value is None and not fx.users:  # returns nothing (an assertion): no outputs
        outputs = []
    elif isinstance(value, (tuple, list)):
        users = {u.args[1]: u for u in fx.users if u.target is operator.getitem}
        outputs = []
        for index, item in enumerate(value):
            name = prefix + (users[index].name if index in users else f"{fx.name}__{index}")
            program.values[name] = _spec(fx, item)
            refs[users[index].name if index in users else name] = Ref(name)
            outputs.append(name)
    else:
        program.values[prefix + fx.name] = _spec(fx, value)
        refs[fx.name] = Ref(prefix + fx.name)
        outputs = [prefix + fx.name]
    return Node(prefix + fx.name, target, tuple(convert(a) for a in fx.args),
                {k: convert(v) for k, v in fx.kwargs.items()}, tuple(outputs))


def _functionalize(program: Program) -> None:
    """``aten.relu_`` and friends become ``aten.relu`` where nothing reads the mutated input later."""
    later_reads: dict[str, int] = {}
    for position, node in enumerate(program.nodes):
        for name in node.reads():
            later_reads[name] = position
    for position, node in enumerate(program.nodes):
        namespace, name, overload = node.target.split(".")
        if namespace != "aten" or not name.endswith("_") or name.startswith("_"):
            continue
        functional = f"aten.{name[:-1]}.{overload}"
        mutated = node.args[0].name if node.args and isinstance(node.args[0], Ref) else None
        if mutated is None or later_reads.get(mutated, position) > position or mutated in program.outputs:
            raise LoweringError(f"node {node.name}: {node.target} mutates {mutated}, which is read "
                                "again later; export a functional graph")
        try:
            getattr(getattr(torch.ops.aten, name[:-1]), overload)
        except AttributeError:
            raise LoweringError(f"node {node.name}: {node.target} has no functional twin") from None
        node.target = functional
