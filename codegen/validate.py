"""Check each op against its shader and rewrite its expressions into stub code.

For every op: the shader exists, `fixed` and `select` name real axes and
values, `select` covers exactly the non-fixed axes, the op has variants,
checks name schema arguments, outputs match the schema's returns, `bind` and
`push` cover the interface of every variant of the op, and every expression
uses only names in scope. Produces `model.ResolvedOp` (what `stubs.py` and
`manifest.py` need). Pure: no files, no templates. Called by `build.py`.
"""

from __future__ import annotations

from codegen.errors import SpecError, did_you_mean
from codegen.expressions import rewrite, rewrite_fstring
from codegen.model import FamilySpec, Interface, OpSpec, ResolvedOp, Variant
from codegen.naming import registry_key
from codegen.variants import check_axis_refs, matches


def resolve_op(
    op: OpSpec,
    family: FamilySpec,
    variants: dict[str, list[Variant]],
    interfaces: dict[str, Interface],
) -> tuple[ResolvedOp | None, list[SpecError]]:
    """Validates one op; returns (resolved op or None, errors)."""
    errors: list[SpecError] = []
    err = errors.append
    shader = next((s for s in family.shaders if s.name == op.shader), None)
    if shader is None:
        names = [s.name for s in family.shaders]
        err(
            SpecError(
                op.shader_loc,
                f"op '{op.name}' uses unknown shader '{op.shader}'"
                f"{did_you_mean(op.shader, names)}; family '{family.name}' has: {', '.join(names)}",
            )
        )
        return None, errors
    schema = op.schema
    if schema is None:
        return None, errors  # already reported by spec.py
    errors += check_axis_refs(shader, op.fixed, f"'fixed' of op '{op.name}'")
    fixed = {m.axis for m in op.fixed}
    axis_names = [a.name for a in shader.axes]
    for s in op.select:
        if s.key in fixed:
            err(
                SpecError(
                    s.loc,
                    f"axis {s.key} is fixed by `fixed` of op '{op.name}'; remove it from select",
                )
            )
        elif s.key not in axis_names:
            err(
                SpecError(
                    s.loc,
                    f"select names unknown axis '{s.key}'{did_you_mean(s.key, axis_names)}; "
                    f"shader '{shader.name}' has axes: {', '.join(axis_names)}",
                )
            )
    missing = [a for a in axis_names if a not in fixed and all(s.key != a for s in op.select)]
    if missing:
        err(
            SpecError(
                op.loc,
                f"op '{op.name}' must select every axis that is not fixed; "
                f"add to select: {', '.join(missing)}",
            )
        )
    if errors:
        return None, errors
    op_variants = tuple(v for v in variants.get(shader.name, []) if matches(op.fixed, v.axes))
    if not op_variants:
        if variants.get(shader.name):
            err(
                SpecError(
                    op.loc,
                    f"op '{op.name}' has no variants: no variant of shader "
                    f"'{shader.name}' matches its `fixed` values",
                )
            )
        return None, errors

    args = {a.name for a in schema.args}
    tensor_args = [a.name for a in schema.args if a.is_tensor]
    modules: set[str] = set()

    used: set[str] = {b.value.text for b in op.bind}  # names that make a let used

    def code(expr, scope, what, uses_lets=False):
        r = rewrite(expr, scope, what, errors)
        if uses_lets:  # a failed expression still counts its names as used
            used.update(r.names if r else _names_of(expr))
        if r is None:
            return None
        modules.update(r.modules)
        return r

    checks = []
    for c in op.checks:
        label = f"check '{c.name}'" if c.name else "inline check"
        if c.arg not in args:
            err(
                SpecError(
                    c.arg_loc,
                    f"{label}: 'arg' must be an argument of {schema.name}, got "
                    f"'{c.arg}'{did_you_mean(c.arg, args)}; arguments: {', '.join(sorted(args))}",
                )
            )
            continue
        cond = code(c.expr, args, label + (f" (used by op '{op.name}')" if c.name else ""))
        msg = rewrite_fstring(c.error, args, f"error of {label}", errors)
        if cond and msg:
            modules.update(msg.modules)
            checks.append((c.arg, cond.code, msg.code))
    scope = set(args)
    lets, let_names = [], {}
    for let in op.lets:
        r = code(let.value, scope, f"let {let.key}")
        if r:
            lets.append((let.key, r.code))
            let_names[let.key] = r.names
        scope.add(let.key)
    select = []
    for axis in axis_names:
        s = next((s for s in op.select if s.key == axis), None)
        if s is not None:
            r = code(s.value, scope, f"select {axis}", uses_lets=True)
            if r:
                select.append((axis, _first_arg(r.names, args, let_names), r.code))
    outputs, output_refs = [], []  # output_refs: the names the outputs' shapes and dtypes use
    out_list = [o.name for o in op.outputs]
    out_names = set(out_list)
    for o in op.outputs:
        if o.name in scope or out_list.count(o.name) > 1:
            err(
                SpecError(
                    o.loc, f"output name '{o.name}' clashes with an argument, let or another output"
                )
            )
        shape = code(o.shape, scope, f"output {o.name} shape", uses_lets=True)
        dtype = code(o.dtype, scope, f"output {o.name} dtype", uses_lets=True)
        if shape and dtype:
            outputs.append((o.name, shape.code, dtype.code))
            output_refs += shape.names + dtype.names
    if len(op.outputs) != len(schema.returns):
        err(
            SpecError(
                op.loc,
                f"op '{op.name}' declares {len(op.outputs)} output(s) but its schema "
                f"returns {len(schema.returns)} tensor(s)",
            )
        )
    if not tensor_args:
        err(
            SpecError(
                op.schema_expr.loc,
                f"op '{op.name}' needs at least one Tensor argument "
                "(its device decides where outputs live)",
            )
        )
    full = scope | out_names
    push = []
    for p in op.push:
        r = code(p.value, full, f"push {p.key}", uses_lets=True)
        if r:
            push.append((p.key, r.code))
    dispatch = None
    if op.dispatch:
        dispatch = code(op.dispatch, full, f"dispatch {op.dispatch_kind}", uses_lets=True)
    bind = _check_bind(
        op, op_variants, interfaces, args, tensor_args, set(let_names), out_names, errors
    )
    _check_push(op, op_variants, interfaces, errors)
    for deps in let_names.values():
        used.update(deps)
    for let in op.lets:
        if let.key not in used:
            err(SpecError(let.loc, f"let '{let.key}' is never used; remove it or use it"))
    needed = _lets_needed(let_names, output_refs)
    if errors:
        return None, errors
    return ResolvedOp(
        op,
        registry_key(op.name),
        op_variants,
        tuple(checks),
        tuple(lets),
        tuple(select),
        tuple(outputs),
        bind,
        tuple(push),
        ("global_size" if op.dispatch_kind == "global" else "groups", dispatch.code),
        tuple(lt for lt in lets if lt[0] in needed),
        tuple(sorted(modules)),
    ), errors


def _names_of(expr) -> list[str]:
    """The free names of an expression whatever its scope ([] if it does not parse)."""
    r = rewrite(expr, _Everything(), "", [])
    return r.names if r else []


class _Everything(set):
    def __contains__(self, item) -> bool:
        return True


def _lets_needed(let_names: dict[str, list[str]], roots: list[str]) -> set[str]:
    """The lets that `roots` need, directly or through other lets."""
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        n = todo.pop()
        if n in let_names and n not in needed:
            needed.add(n)
            todo += let_names[n]
    return needed


def _first_arg(names: list[str], args: set[str], lets: dict[str, list[str]]) -> str | None:
    """The first schema argument `names` mention, directly or through lets (which can
    only name earlier lets, so this terminates)."""
    for n in names:
        if n in args:
            return n
        if n in lets:
            found = _first_arg(lets[n], args, lets)
            if found:
                return found
    return None


def _check_bind(op, op_variants, interfaces, args, tensor_args, lets, outputs, errors):
    bound = {b.key: b for b in op.bind}
    shader_bindings = []
    for v in op_variants:
        for slot in interfaces[v.name].bindings:
            if slot.name not in shader_bindings:
                shader_bindings.append(slot.name)
    for b in op.bind:
        name = b.value.text
        if b.key not in shader_bindings:
            errors.append(
                SpecError(
                    b.loc,
                    f"bind names unknown binding '{b.key}'"
                    f"{did_you_mean(b.key, shader_bindings)}; the variants of op "
                    f"'{op.name}' have: {', '.join(shader_bindings)}",
                )
            )
        elif any(all(s.name != b.key for s in interfaces[v.name].bindings) for v in op_variants):
            errors.append(
                SpecError(
                    b.loc,
                    f"binding '{b.key}' exists in only some variants of op "
                    f"'{op.name}'; fix its `when` or the op's `fixed`",
                )
            )
        if name in args and name not in tensor_args:
            errors.append(
                SpecError(b.value.loc, f"bind {b.key}: argument '{name}' is not a Tensor")
            )
        elif name not in args and name not in lets and name not in outputs:
            choices = sorted(set(tensor_args) | lets | outputs)
            errors.append(
                SpecError(
                    b.value.loc,
                    f"bind {b.key}: unknown name '{name}'"
                    f"{did_you_mean(name, choices)}; expected a Tensor argument, a let "
                    f"or an output: {', '.join(choices)}",
                )
            )
    missing = [n for n in shader_bindings if n not in bound]
    if missing:
        errors.append(
            SpecError(
                op.bind_loc,
                f"bind of op '{op.name}' does not cover binding(s) "
                f"{', '.join(missing)} of its variants; add them to bind",
            )
        )
    bound_names = {b.value.text for b in op.bind}
    for o in op.outputs:
        if o.name not in bound_names:
            errors.append(
                SpecError(
                    o.loc, f"output '{o.name}' is not bound; add '<binding>: {o.name}' to bind"
                )
            )
    order = {n: i for i, n in enumerate(shader_bindings)}
    result = []
    for b in sorted(op.bind, key=lambda b: order.get(b.key, len(order))):
        name = b.value.text
        kind = "output" if name in outputs else "let" if name in lets else "arg"
        result.append((b.key, name, kind))
    return tuple(result)


def _check_push(op, op_variants, interfaces, errors):
    given = {p.key for p in op.push}
    needed: list[str] = []
    for v in op_variants:
        for f in interfaces[v.name].push_fields:
            if f.name not in needed:
                needed.append(f.name)
    missing = [n for n in needed if n not in given]
    if missing:
        errors.append(
            SpecError(
                op.push_loc,
                f"push of op '{op.name}' does not cover push constant(s) "
                f"{', '.join(missing)} of its variants; add them to push",
            )
        )
    for p in op.push:
        if p.key not in needed:
            errors.append(
                SpecError(
                    p.loc,
                    f"push sets '{p.key}', which no variant of op '{op.name}' "
                    f"declares{did_you_mean(p.key, needed)}; declared: {', '.join(needed) or '(none)'}",
                )
            )
