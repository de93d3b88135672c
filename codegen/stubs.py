"""Prepare the view of one family's Python stub module for templates/ops.py.j2.

Turns `ResolvedOp`s into the strings the stub template lays out (internals.md
§4): signatures, argument checks, lets, then per step the `op.select` call,
uploads, output and scratch allocation and the dispatch call (or, for a
dispatcher op, the choice of route), and the `OpDef` fields. All naming comes from
`naming.py`. Must not render templates or write files. Called by `build.py`.
"""

from __future__ import annotations

import ast
import json
import re

from codegen.model import FamilySpec, ResolvedOp
from codegen.naming import GENERATOR, check_function, fake_function, op_constant, registry_key
from codegen.plans import plannable


def _q(text: str) -> str:
    """A double-quoted Python string literal."""
    return json.dumps(text)


def _tuple(items: list[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def _dict(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{_q(k)}: {v}" for k, v in pairs) + "}"


def _params(op: ResolvedOp) -> tuple[list[str], list[str]]:
    positional, keyword = [], []
    for a in op.spec.schema.args:
        text = a.name if a.default is None else f"{a.name}={a.default}"
        (keyword if a.kw_only else positional).append(text)
    return positional, keyword


def _signature(name: str, lead: list[str], op: ResolvedOp, extra: list[str]) -> str:
    positional, keyword = _params(op)
    params = lead + positional
    if keyword or extra:
        params += ["*", *keyword, *extra]
    return f"def {name}({', '.join(params)}):"


def _negate(cond: str) -> str:
    """`not (cond)`, written `a not in b` for a membership test and `a is not b` for an
    identity test (as linters want them)."""
    tree = ast.parse(cond, mode="eval").body
    flip = {ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
    if isinstance(tree, ast.Compare) and len(tree.ops) == 1 and type(tree.ops[0]) in flip:
        tree.ops = [flip[type(tree.ops[0])]()]
        return ast.unparse(tree)
    return f"not ({cond})"


def _check_lines(arg: str, cond: str, message: str) -> list[str]:
    return [f"if {_negate(cond)}:", f"    raise rt.ArgumentError(op, {_q(arg)}, {message})"]


def _family_checks(ops: list[ResolvedOp]) -> list[dict]:
    """One function per named check the family's ops use, in first-use order."""
    seen: dict[str, dict] = {}
    for op in ops:
        for name, arg, cond, message, used in op.checks:
            if name and name not in seen:
                seen[name] = {
                    "signature": f"def {check_function(name)}({', '.join(['op', *used])}):",
                    "body": _check_lines(arg, cond, message),
                }
    return list(seen.values())


def _record_body(op: ResolvedOp) -> list[str]:
    schema = op.spec.schema
    lines = [
        f'"""Record {op.key} into `stream`; returns device tensors."""',
        f"op = {op_constant(op.spec.name)}",
    ]
    for a in schema.args:
        typ = re.sub(r"\[\d+\]", "[]", a.type)
        lines.append(f"rt.check_arg(op, {_q(a.name)}, {a.name}, {_q(typ)})")
    for name, arg, cond, message, used in op.checks:
        if name:  # a family check: one function in the module, called by every op using it
            lines.append(f"{check_function(name)}({', '.join(['op', *used])})")
        else:
            lines += _check_lines(arg, cond, message)
    lines += [f"{name} = {code}" for name, code in op.lets]
    if op.routes:
        return lines + _route_lines(op)
    layouts = dict(op.layouts)
    aliases = dict(op.aliases)
    shapes = {name: (shape, dtype) for name, shape, dtype in (*op.outputs, *op.scratch)}
    ready: set[str] = set()
    for i, step in enumerate(op.steps):
        wanted = [
            (axis, f"({_q(arg) if arg else 'None'}, {code})") for axis, arg, code in step.select
        ]
        at = f", step={i}" if len(op.steps) > 1 else ""
        lines.append(f"v = op.select(variant, storage, {_dict(wanted)}{at})")
        # Inputs first, then outputs and scratch, each once: at its first step.
        order = sorted(step.bind, key=lambda b: b[2] in ("output", "scratch"))
        for binding, name, kind in order:
            if name in ready:
                continue
            ready.add(name)
            layout = f", layout={layouts[name]}" if name in layouts else ""
            if name in aliases:  # written in place: the argument's device tensor
                lines.append(
                    f"{name} = stream.upload({aliases[name]}, v.binding({_q(binding)}), "
                    f"op.label({_q(aliases[name])}){layout})"
                )
            elif kind in ("output", "scratch"):
                shape, dtype = shapes[name]
                scratch = ", scratch=True" if kind == "scratch" else ""
                lines.append(
                    f"{name} = stream.empty({shape}, {dtype}, v.binding({_q(binding)}), "
                    f"op.label({_q(name)}, {_q(kind)}){layout}{scratch})"
                )
            else:
                label = f"op.label({_q(name)}{', ' + _q('value') if kind == 'let' else ''})"
                lines.append(
                    f"{name} = stream.upload({name}, v.binding({_q(binding)}), {label}{layout})"
                )
        bindings = _dict([(b, n) for b, n, _ in step.bind])
        extra = f", spec_constants={_dict(list(step.spec))}" if step.spec else ""
        kind, code = step.dispatch
        push = _dict(list(step.push))
        if step.conditional_push:
            push = f"v.own_push({push})"
        lines.append(
            f"stream.dispatch(v, op.name, bindings={bindings}, push={push}{extra}, {kind}={code})"
        )
    names = [n for n, _, _ in op.outputs]
    lines.append("return " + (", ".join(names) if names else "None"))
    return lines


def _route_lines(op: ResolvedOp) -> list[str]:
    """The body of a dispatcher op after its checks and lets: pick a route, record it."""
    lines = []
    for i, (when, target) in enumerate(op.routes):
        if when is None and i == 0:
            lines.append(f"target = {op_constant(target)}")
            continue
        lines.append("else:" if when is None else f"{'elif' if i else 'if'} {when}:")
        lines.append(f"    target = {op_constant(target)}")
    positional, keyword = [], []
    for a in op.spec.schema.args:
        (keyword if a.kw_only else positional).append(a.name)
    call = ", ".join(
        ["stream", *positional, *(f"{k}={k}" for k in keyword), "variant=variant", "storage=storage"]
    )
    lines.append(f"return op.route(target, variant).record({call})")
    return lines


def _fake_body(op: ResolvedOp) -> list[str]:
    tensors = [a for a in op.spec.schema.args if a.is_tensor]
    # the outputs' device: the first tensor argument's, or the first given of optional ones
    device = next((f"{a.name}.device" for a in tensors if a.type == "Tensor"),
                  f"next(t for t in ({', '.join(a.name for a in tensors)},) if t is not None).device")
    lines = [f"{name} = {code}" for name, code in op.fake_lets]
    empties = [
        f"torch.empty({shape}, dtype={dtype}, device={device})"
        for _, shape, dtype in op.outputs
    ]
    if len(empties) == 1:
        lines.append(f"return {empties[0]}")
    else:
        lines.append("return (")
        lines += [f"    {e}," for e in empties]
        lines.append(")")
    return lines


def _alias_indices(op: ResolvedOp) -> list[tuple[int, str]]:
    """(output index, argument) of each output written in place."""
    names = [n for n, _, _ in op.outputs]
    return [(names.index(output), arg) for output, arg in op.aliases]


def _opdef(op: ResolvedOp) -> list[str]:
    spec = op.spec
    variants = [
        f"({_q(v.name)}, {_dict([(k, _q(x)) for k, x in v.axes.items()])})," for v in op.variants
    ]
    steps = [_tuple([_q(v.name) for v in step.variants]) + "," for step in op.steps]
    if len(op.steps) == 1:  # the default: one step of every variant
        steps_lines = []
    else:
        steps_lines = ["steps=(", *(f"    {st}" for st in steps), "),"]
    return [
        f"name={_q(registry_key(spec.name))},",
        f"family={_q(spec.family)},",
        f"schema={_q(spec.schema.text)},",
        f"doc={_q(spec.doc)},",
        f"spec={_q(spec.loc.short())},",
        f"reference={_q(spec.reference)},",
        "variants=(",
        *(f"    {v}" for v in variants),
        "),",
        *steps_lines,
        f"record={spec.name},",
        f"fake={fake_function(spec.name)},",
        *([f"aliases={_tuple([f'({i}, {_q(a)})' for i, a in _alias_indices(op)])},"]
          if op.aliases else []),
        *(["plannable=True,"] if plannable(op) else []),
    ]


def stub_view(family: FamilySpec, ops: list[ResolvedOp], template: str) -> dict:
    """The context of templates/ops.py.j2 for one family."""
    modules = sorted({m for op in ops for m in op.modules} - {"torch"})
    views = []
    for op in ops:
        name = op.spec.name
        views.append(
            {
                "name": name,
                "constant": op_constant(name),
                "signature": _signature(name, ["stream"], op, ["variant=None", "storage=None"]),
                "body": _record_body(op),
                "fake_signature": _signature(fake_function(name), [], op, []),
                "fake_body": _fake_body(op),
                "opdef": _opdef(op),
            }
        )
    return {
        "header": f"# @generated by `{GENERATOR}` from {family.file} with {template}; do not edit.",
        "family": family.name,
        "spec": family.file,
        "stdlib": modules,
        "checks": _family_checks(ops),
        "ops": views,
        "constants": [op_constant(op.spec.name) for op in ops],
    }
