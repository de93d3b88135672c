"""A ``torch.export`` program as a `Program`: the same graph, op for op.

Parameters, buffers and lifted constants become the program's constants
(named after their placeholders); user inputs and outputs keep their
order; every ``call_function`` of an op overload becomes a `Node` whose
target is ``"<namespace>.<op>.<overload>"``, a tuple result's ``getitem``
users naming its outputs (an op that returns nothing, such as an assertion,
has none and is dropped later as unused).

Buffers the program mutates become its state (a decoder's static KV cache):
those the signature lists as buffer mutations (a functional export) and
those an op writes in place (``index_copy_``, ``copy_``, ``add_``, as
``TorchExportableModuleForDecoderOnlyLM`` exports them), directly or through
an alias. In-place ops become their functional twins, later reads of what
they wrote read the new value, and each state's last value is its update
(`Program.state_updates`); a state starts as zeros unless its buffer held
other values. What a program cannot hold is refused with a `LoweringError`
naming the node: dynamic shapes with no sizes given, parameter or input mutations, writes
through a view (but in-place dropouts with train False, which change nothing),
higher-order ops (but ``wrap_with_set_grad_enabled``, whose
body is inlined: grad mode does not matter to inference), arguments of
other types. A program exported with dynamic shapes is converted for given
values of its size symbols (`sizes`): every shape and every symbolic size
the graph computes becomes a plain int, as if it had been exported for
those sizes. Patterns are rewritten afterwards (lower.py). Never touches
Vulkan. Used by lower.py.
"""

from __future__ import annotations

import operator

import torch
from torch.export import ExportedProgram
from torch.export import graph_signature as sig
from torch.fx import Node as FxNode

from runtime.errors import EtvkError
from runtime.programs.cpu import UnknownOp, resolve_op
from runtime.programs.nodes import Const, Node, Ref, ValueSpec, map_args
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


_SYMBOLIC = (torch.SymInt, torch.SymBool, torch.SymFloat)


def _concrete(node: FxNode, value, sizes: dict):
    """A symbolic int, bool or float as a plain one for `sizes` (symbol -> int); others as they are."""
    if not isinstance(value, _SYMBOLIC):
        return value
    expr = value.node.expr
    free = expr.free_symbols - set(sizes)
    if free:
        raise LoweringError(f"node {node.name}: its size depends on {', '.join(sorted(map(str, free)))}, "
                            "which no dynamic input dimension gives; export the model with static shapes")
    result = expr.xreplace(sizes)
    kind = {torch.SymInt: int, torch.SymBool: bool, torch.SymFloat: float}[type(value)]
    return kind(result)


def _spec(node: FxNode, value, sizes: dict) -> ValueSpec:
    if not isinstance(value, torch.Tensor):
        raise LoweringError(f"node {node.name}: its value is {type(value).__name__}, not a tensor")
    if not sizes and not all(isinstance(size, int) for size in value.shape):
        raise LoweringError(f"node {node.name}: dynamic shape {list(value.shape)}; export the model "
                            "with static shapes")
    return ValueSpec(tuple(_concrete(node, size, sizes) for size in value.shape), value.dtype)


def from_exported(exported: ExportedProgram, sizes: dict | None = None) -> Program:
    """Converts `exported` op for op (see the module docstring).

    Args:
        exported: the program.
        sizes: for a program exported with dynamic shapes, each size symbol (a sympy
            symbol of its inputs' shapes) -> the int to convert it for.

    Raises:
        LoweringError: the program holds something a runtime program cannot.
    """
    sizes = sizes or {}
    signature = exported.graph_signature
    for spec in signature.output_specs:
        if spec.kind not in (sig.OutputKind.BUFFER_MUTATION, sig.OutputKind.USER_OUTPUT):
            raise LoweringError(f"the program mutates {spec.target} ({spec.kind.name.lower()}); only "
                                "buffers may be mutated (they become the program's state)")
    kinds = {s.arg.name: s for s in signature.input_specs if isinstance(s.arg, sig.TensorArgument)}
    buffer_names = {s.target: s.arg.name for s in kinds.values() if s.kind == sig.InputKind.BUFFER}
    state = {buffer_names[s.target] for s in signature.output_specs
             if s.kind == sig.OutputKind.BUFFER_MUTATION} | _mutated_in_place(exported.graph, kinds)
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
            if spec.kind == sig.InputKind.USER_INPUT or fx.name in state:
                program.values[fx.name] = _spec(fx, fx.meta.get("val"), sizes)
                refs[fx.name] = Ref(fx.name)
            else:
                tensor = exported.state_dict.get(spec.target, exported.constants.get(spec.target))
                program.constants[fx.name] = tensor.detach()
                refs[fx.name] = Const(fx.name)
            if fx.name in state:
                program.state[fx.name] = _state_start(program, fx.name,
                                                      exported.state_dict.get(spec.target,
                                                                              exported.constants.get(spec.target)))
        elif fx.op in ("get_attr", "call_function"):
            _call(fx, refs, program, exported.graph_module, "", sizes)
        elif fx.op == "output":
            for out, spec in zip(fx.args[0], signature.output_specs, strict=True):
                if not isinstance(out, FxNode):
                    raise LoweringError(f"output {out!r} is not a tensor of the graph")
                if spec.kind == sig.OutputKind.USER_OUTPUT:
                    program.outputs.append(refs[out.name].name)
                else:
                    program.state_updates[buffer_names[spec.target]] = refs[out.name].name
            # A model that returns one tensor gets one back; any other structure, a tuple.
            program.output_tuple = not exported.call_spec.out_spec.is_leaf()
        else:
            raise LoweringError(f"node {fx.name}: {fx.op} nodes are not supported")
    _functionalize(program)
    _drop_overwritten_state(program)
    return program


def _mutated_in_place(graph, kinds: dict) -> set[str]:
    """The buffer placeholders that an op of `graph` writes in place, directly or through an
    alias or view."""
    root: dict[str, str] = {}
    mutated = set()
    for fx in graph.nodes:
        if fx.op != "call_function" or not isinstance(fx.target, torch._ops.OpOverload):
            continue
        source = fx.args[0] if fx.args and isinstance(fx.args[0], FxNode) else None
        if source is not None and (_is_view(fx.target) or target_name(fx.target) in _ALIAS_OPS):
            root[fx.name] = root.get(source.name, source.name)
        position = _written_argument(fx.target)
        written = fx.args[position] if position is not None and position < len(fx.args) else None
        if isinstance(written, FxNode):
            mutated.add(root.get(written.name, written.name))
    return {name for name in mutated if name in kinds and kinds[name].kind == sig.InputKind.BUFFER}


def _state_start(program: Program, name: str, tensor: torch.Tensor) -> str | None:
    """How state `name` starts: None for zeros, else the constant holding `tensor`."""
    if not bool(tensor.any()):
        return None
    program.constants[f"{name}__start"] = tensor.detach().clone()
    return f"{name}__start"


def _call(fx: FxNode, refs: dict, program: Program, module: torch.nn.Module, prefix: str,
          sizes: dict) -> None:
    """Converts one get_attr or call_function node of `module`'s graph into `program`; a node
    computing a symbolic size becomes its value for `sizes` (read by later nodes as an int)."""
    if isinstance(fx.meta.get("val"), _SYMBOLIC):
        refs[fx.name] = _concrete(fx, fx.meta["val"], sizes)
    elif fx.op == "get_attr":
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
        _inline(fx, refs, program, prefix, sizes)
    else:
        program.nodes.append(_node(fx, refs, program, prefix, sizes))


def _inline(fx: FxNode, refs: dict, program: Program, prefix: str, sizes: dict) -> None:
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
            _call(node, inner, program, body, inner_prefix, sizes)


def _node(fx: FxNode, refs: dict, program: Program, prefix: str, sizes: dict) -> Node:
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
            program.values[name] = _spec(fx, item, sizes)
            refs[users[index].name if index in users else name] = Ref(name)
            outputs.append(name)
    else:
        program.values[prefix + fx.name] = _spec(fx, value, sizes)
        refs[fx.name] = Ref(prefix + fx.name)
        outputs = [prefix + fx.name]
    return Node(prefix + fx.name, target, tuple(convert(a) for a in fx.args),
                {k: convert(v) for k, v in fx.kwargs.items()}, tuple(outputs))


# Ops whose result is their first argument itself in eager PyTorch when they change nothing
# (the same dtype, no copy asked).
_ALIAS_OPS = {"aten.alias.default", "aten.detach.default", "aten.to.dtype", "aten.to.dtype_layout",
              "aten.to.device", "aten.to.other"}


# In-place dropouts, (self, p, train): with train False they change nothing (PT2E exports of
# some torch versions keep a classifier's inplace Dropout, on a view); each becomes the functional
# ``aten.dropout`` (train False), which lower_cnn.py drops as the identity it is.
_EVAL_IDENTITIES = {"aten.dropout_.default", "aten.feature_dropout_.default", "aten.alpha_dropout_.default",
                    "aten.feature_alpha_dropout_.default"}


def _is_view(op: torch._ops.OpOverload) -> bool:
    """Whether `op` returns a view of an argument (its schema marks the result as an alias)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def _written_argument(op: torch._ops.OpOverload) -> int | None:
    """The position of the argument `op` writes in place, or None."""
    return next((i for i, a in enumerate(op._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write), None)


def _functionalize(program: Program) -> None:
    """In-place ``aten`` ops become their functional twins, and every later read of the tensor
    they wrote (or of an alias of it) reads the new value instead; a state written this way is
    updated to its last value when a call ends, as a buffer mutation in the signature is.

    Raises:
        LoweringError: an op writes a constant, a program input, a view, or an argument other
            than its first one, or has no functional twin.
    """
    latest: dict[str, str] = {}  # written tensor -> the value that now holds it
    root: dict[str, str] = {}  # alias or version -> the tensor it is
    views: dict[str, str] = {}  # a view (not the whole tensor) -> what it views

    def current(a):
        return Ref(latest.get(root.get(a.name, a.name), a.name)) if isinstance(a, Ref) else a

    for node in program.nodes:
        node.args, node.kwargs = map_args(node.args, current), map_args(node.kwargs, current)
        if not node.target.startswith("aten.") or not node.outputs:
            continue
        if node.target in _EVAL_IDENTITIES and node.args[2:3] == (False,):  # in place, and a no-op
            node.target, node.args, node.kwargs = "aten.dropout.default", node.args[:3], {}
        op = resolve_op(node.target)
        first = node.args[0] if node.args and isinstance(node.args[0], Ref) else None
        position = _written_argument(op)
        if position is None:
            if first is None:
                continue
            whole = node.target in _ALIAS_OPS and not node.kwargs.get("copy", False) and \
                program.values[node.outputs[0]].dtype == program.values[first.name].dtype
            if whole:
                root[node.outputs[0]] = root.get(first.name, first.name)
            elif _is_view(op):
                views[node.outputs[0]] = root.get(first.name, first.name)
            continue
        written = node.args[position] if position < len(node.args) else None
        name = node.target.split(".")[1]
        functional = f"aten.{name[:-1]}.{node.target.split('.')[2]}"
        if isinstance(written, Const):
            raise LoweringError(f"node {node.name}: {node.target} writes the constant {written.name} in "
                                "place; only buffers may be mutated (they become the program's state)")
        if position != 0 or not isinstance(written, Ref) or not name.endswith("_"):
            raise LoweringError(f"node {node.name}: {node.target} writes {written!r} in place, "
                                "which a program cannot express; export a functional graph")
        target = root.get(written.name, written.name)
        if target in views:
            raise LoweringError(f"node {node.name}: {node.target} writes a view of {views[target]} in "
                                "place; export a functional graph")
        if target in program.inputs:
            raise LoweringError(f"node {node.name}: {node.target} writes the program input {target}; "
                                "export a program that leaves its inputs unchanged")
        try:
            resolve_op(functional)
        except UnknownOp:
            raise LoweringError(f"node {node.name}: {node.target} has no functional twin") from None
        node.target = functional
        latest[target] = node.outputs[0]
        root[node.outputs[0]] = target
    for target, value in latest.items():
        if target in program.state:
            program.state_updates[target] = value
    program.outputs = [latest.get(root.get(n, n), n) for n in program.outputs]


def _drop_overwritten_state(program: Program) -> None:
    """A state whose value a call only ever overwrites whole (its one reader is ``copy(state,
    src)``) carries nothing across calls: it becomes a constant (its start), and no state."""
    for name, start in list(program.state.items()):
        readers = [n for n in program.nodes if name in n.reads()]
        if len(readers) != 1 or readers[0].target != "aten.copy.default" or \
                readers[0].args[0] != Ref(name) or name in readers[0].args[1:] or name in program.outputs:
            continue
        constant = start or f"{name}__start"
        if start is None:
            program.constants[constant] = torch.zeros(program.values[name].shape,
                                                      dtype=program.values[name].dtype)
        readers[0].args = (Const(constant), *readers[0].args[1:])
        del program.state[name], program.values[name]
        program.state_updates.pop(name, None)
