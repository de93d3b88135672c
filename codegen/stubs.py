"""Prepare the view of one family's Python stub module for templates/ops.py.j2.

Turns `ResolvedOp`s into the strings the stub template lays out (internals.md
§4): signatures, argument checks, lets, the `op.select` call, uploads, output
allocation, the dispatch call and the `OpDef` fields. All naming comes from
`naming.py`. Must not render templates or write files. Called by `build.py`.
"""

from __future__ import annotations

import json
import re

from codegen.model import FamilySpec, ResolvedOp
from codegen.naming import GENERATOR, fake_function, op_constant, registry_key


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


def _record_body(op: ResolvedOp) -> list[str]:
    schema = op.spec.schema
    lines = [
        f'"""Record {op.key} into `stream`; returns device tensors."""',
        f"op = {op_constant(op.spec.name)}",
    ]
    for a in schema.args:
        typ = re.sub(r"\[\d+\]", "[]", a.type)
        lines.append(f"rt.check_arg(op, {_q(a.name)}, {a.name}, {_q(typ)})")
    for arg, cond, message in op.checks:
        lines.append(f"if not ({cond}):")
        lines.append(f"    raise rt.ArgumentError(op, {_q(arg)}, {message})")
    lines += [f"{name} = {code}" for name, code in op.lets]
    wanted = [(axis, f"({_q(arg) if arg else 'None'}, {code})") for axis, arg, code in op.select]
    lines.append(f"v = op.select(variant, storage, {_dict(wanted)})")
    for binding, name, kind in op.bind:
        if kind != "output":
            label = f"op.label({_q(name)}{', ' + _q('value') if kind == 'let' else ''})"
            lines.append(f"{name} = stream.upload({name}, v.binding({_q(binding)}), {label})")
    for name, shape, dtype in op.outputs:
        binding = next(b for b, n, _ in op.bind if n == name)
        lines.append(
            f"{name} = stream.empty({shape}, {dtype}, v.binding({_q(binding)}), "
            f"op.label({_q(name)}, {_q('output')}))"
        )
    bindings = _dict([(b, n) for b, n, _ in op.bind])
    push = _dict(list(op.push))
    kind, code = op.dispatch
    lines.append(f"stream.dispatch(v, op.name, bindings={bindings}, push={push}, {kind}={code})")
    names = [n for n, _, _ in op.outputs]
    lines.append("return " + (", ".join(names) if names else "None"))
    return lines


def _fake_body(op: ResolvedOp) -> list[str]:
    device = next(a.name for a in op.spec.schema.args if a.is_tensor)
    lines = [f"{name} = {code}" for name, code in op.fake_lets]
    empties = [
        f"torch.empty({shape}, dtype={dtype}, device={device}.device)"
        for _, shape, dtype in op.outputs
    ]
    if len(empties) == 1:
        lines.append(f"return {empties[0]}")
    else:
        lines.append("return (")
        lines += [f"    {e}," for e in empties]
        lines.append(")")
    return lines


def _opdef(op: ResolvedOp) -> list[str]:
    spec = op.spec
    axes = [a.name for a in op.variants[0].shader.axes]
    variants = [
        f"({_q(v.name)}, {_dict([(k, _q(x)) for k, x in v.axes.items()])})," for v in op.variants
    ]
    return [
        f"name={_q(registry_key(spec.name))},",
        f"family={_q(spec.family)},",
        f"schema={_q(spec.schema.text)},",
        f"doc={_q(spec.doc)},",
        f"spec={_q(spec.loc.short())},",
        f"reference={_q(spec.reference)},",
        f"axes={_tuple([_q(a) for a in axes]) if axes else '()'},",
        "variants=(",
        *(f"    {v}" for v in variants),
        "),",
        f"record={spec.name},",
        f"fake={fake_function(spec.name)},",
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
        "ops": views,
        "constants": [op_constant(op.spec.name) for op in ops],
    }
