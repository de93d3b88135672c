"""Check each op against its shaders and rewrite its expressions into stub code.

For every op: checks name schema arguments, outputs match the schema's
returns, and every expression uses only names in scope. For each step: the
shader exists, `fixed` and `select` name real axes and values, `select`
covers exactly the non-fixed axes, the step has variants, `spec` names the
shader's spec constants, and `bind` and `push` cover the interface of every
variant of the step. A dispatcher op's routes name ops of the family with the
same arguments. Produces `model.ResolvedOp` (what `stubs.py` and
`manifest.py` need). Pure: no files, no templates. Called by `build.py`.
"""

from __future__ import annotations

from codegen.errors import SpecError, did_you_mean
from codegen.expressions import rewrite, rewrite_fstring
from codegen.model import (
    FamilySpec,
    Interface,
    OpSpec,
    ResolvedOp,
    ResolvedStep,
    StepSpec,
    Variant,
)
from codegen.naming import registry_key
from codegen.variants import check_axis_refs, matches


class _Scope:
    """Rewrites expressions of one op, collecting errors, modules and the names lets feed."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        self.modules: set[str] = set()
        self.used: set[str] = set()  # names that make a let used

    def code(self, expr, scope, what, uses_lets=True):
        r = rewrite(expr, scope, what, self.errors)
        if uses_lets:  # a failed expression still counts its names as used
            self.used.update(r.names if r else _names_of(expr))
        if r is None:
            return None
        self.modules.update(r.modules)
        return r


def resolve_op(
    op: OpSpec,
    family: FamilySpec,
    variants: dict[str, list[Variant]],
    interfaces: dict[str, Interface],
    resolved: dict[str, ResolvedOp] | None = None,
) -> tuple[ResolvedOp | None, list[SpecError]]:
    """Validates one op; returns (resolved op or None, errors).

    `resolved` holds the family's ops resolved so far; a dispatcher op's routes
    must name ops in it (build.py resolves dispatchers last).
    """
    errors: list[SpecError] = []
    err = errors.append
    schema = op.schema
    if schema is None:
        return None, errors  # already reported by spec.py
    x = _Scope(errors)
    args = {a.name for a in schema.args}
    tensor_args = [a.name for a in schema.args if a.is_tensor]

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
        what = label + (f" (used by op '{op.name}')" if c.name else "")
        cond = x.code(c.expr, args, what, uses_lets=False)
        msg = rewrite_fstring(c.error, args, f"error of {label}", errors)
        if cond and msg:
            x.modules.update(msg.modules)
            checks.append((c.arg, cond.code, msg.code))
    scope = set(args)
    lets, let_names = [], {}
    for let in op.lets:
        r = x.code(let.value, scope, f"let {let.key}", uses_lets=False)
        if r:
            lets.append((let.key, r.code))
            let_names[let.key] = r.names
        scope.add(let.key)
    outputs, output_refs = _tensors(op.outputs, "output", scope, set(), x)
    out_names = {o.name for o in op.outputs}
    scratch, _ = _tensors(op.scratch, "scratch", scope, out_names, x)
    scratch_names = {t.name for t in op.scratch}
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
    tensors = set(tensor_args) | set(let_names) | out_names | scratch_names
    layouts = []
    for n in op.layouts:
        if n.key not in tensors:
            err(
                SpecError(
                    n.loc,
                    f"layouts names unknown tensor '{n.key}'{did_you_mean(n.key, tensors)}; "
                    f"expected a Tensor argument, a let, an output or a scratch: "
                    f"{', '.join(sorted(tensors))}",
                )
            )
        r = x.code(n.value, scope, f"layout of {n.key}")
        if r:
            layouts.append((n.key, r.code))
    full = scope | out_names | scratch_names
    steps = []
    for i, step in enumerate(op.steps):
        who = f"op '{op.name}'" if len(op.steps) == 1 else f"step {i + 1} of op '{op.name}'"
        names = (args, tensor_args, let_names, out_names, scratch_names)
        r = _resolve_step(step, who, family, variants, interfaces, scope, full, names, x)
        if r:
            steps.append(r)
    bound = {b.value.text for s in op.steps for b in s.bind}
    if op.steps:
        for o in (*op.outputs, *op.scratch):
            if o.name not in bound:
                err(
                    SpecError(
                        o.loc, f"'{o.name}' is not bound; add '<binding>: {o.name}' to a bind"
                    )
                )
    x.used.update(bound)
    routes = _resolve_routes(op, family, resolved or {}, scope, x)
    for deps in let_names.values():
        x.used.update(deps)
    for let in op.lets:
        if let.key not in x.used:
            err(SpecError(let.loc, f"let '{let.key}' is never used; remove it or use it"))
    needed = _lets_needed(let_names, output_refs)
    if errors:
        return None, errors
    if routes:
        op_variants = tuple(v for _, target in routes for v in resolved[target].variants)
    else:
        op_variants = tuple(v for s in steps for v in s.variants)
    return ResolvedOp(
        op,
        registry_key(op.name),
        tuple({v.name: v for v in op_variants}.values()),
        tuple(checks),
        tuple(lets),
        tuple(outputs),
        tuple(scratch),
        tuple(layouts),
        tuple(steps),
        tuple(routes),
        tuple(lt for lt in lets if lt[0] in needed),
        tuple(sorted(x.modules)),
    ), errors


def _tensors(entries, kind: str, scope: set[str], taken: set[str], x: _Scope):
    """Resolved (name, shape code, dtype code) of outputs or scratch, and the names they use."""
    out, refs = [], []
    names = [e.name for e in entries]
    for e in entries:
        if e.name in scope or e.name in taken or names.count(e.name) > 1:
            x.errors.append(
                SpecError(
                    e.loc,
                    f"{kind} name '{e.name}' clashes with an argument, let, output or scratch",
                )
            )
        shape = x.code(e.shape, scope, f"{kind} {e.name} shape")
        dtype = x.code(e.dtype, scope, f"{kind} {e.name} dtype")
        if shape and dtype:
            out.append((e.name, shape.code, dtype.code))
            refs += shape.names + dtype.names
    return out, refs


def _resolve_step(step: StepSpec, who, family, variants, interfaces, scope, full, names, x):
    errors = x.errors
    err = errors.append
    shader = next((s for s in family.shaders if s.name == step.shader), None)
    if shader is None:
        shaders = [s.name for s in family.shaders]
        err(
            SpecError(
                step.shader_loc,
                f"{who} uses unknown shader '{step.shader}'"
                f"{did_you_mean(step.shader, shaders)}; family '{family.name}' has: "
                f"{', '.join(shaders)}",
            )
        )
        return None
    before = len(errors)
    errors += check_axis_refs(shader, step.fixed, f"'fixed' of {who}")
    fixed = {m.axis for m in step.fixed}
    axis_names = [a.name for a in shader.axes]
    for s in step.select:
        if s.key in fixed:
            err(SpecError(s.loc, f"axis {s.key} is fixed by `fixed` of {who}; remove it from select"))
        elif s.key not in axis_names:
            err(
                SpecError(
                    s.loc,
                    f"select names unknown axis '{s.key}'{did_you_mean(s.key, axis_names)}; "
                    f"shader '{shader.name}' has axes: {', '.join(axis_names)}",
                )
            )
    missing = [a for a in axis_names if a not in fixed and all(s.key != a for s in step.select)]
    if missing:
        err(
            SpecError(
                step.loc,
                f"{who} must select every axis that is not fixed; "
                f"add to select: {', '.join(missing)}",
            )
        )
    if len(errors) > before:
        return None
    step_variants = tuple(v for v in variants.get(shader.name, []) if matches(step.fixed, v.axes))
    if not step_variants:
        if variants.get(shader.name):
            err(
                SpecError(
                    step.loc,
                    f"{who} has no variants: no variant of shader "
                    f"'{shader.name}' matches its `fixed` values",
                )
            )
        return None
    args, tensor_args, lets, outputs, scratch = names
    select = []
    for axis in axis_names:
        s = next((s for s in step.select if s.key == axis), None)
        if s is not None:
            r = x.code(s.value, scope, f"select {axis}")
            if r:
                select.append((axis, _first_arg(r.names, args, lets), r.code))
    declared = [c.name for c in shader.spec_constants]
    spec = []
    for n in step.spec:
        if n.key not in declared:
            err(
                SpecError(
                    n.loc,
                    f"spec names unknown spec constant '{n.key}'{did_you_mean(n.key, declared)}; "
                    f"shader '{shader.name}' declares: {', '.join(declared) or '(none)'}",
                )
            )
        r = x.code(n.value, full, f"spec {n.key}")
        if r:
            spec.append((n.key, r.code))
    push = []
    for p in step.push:
        r = x.code(p.value, full, f"push {p.key}")
        if r:
            push.append((p.key, r.code))
    dispatch = None
    if step.dispatch:
        dispatch = x.code(step.dispatch, full, f"dispatch {step.dispatch_kind}")
    bind = _check_bind(step, who, step_variants, interfaces, names, errors)
    _check_push(step, who, step_variants, interfaces, errors)
    if len(errors) > before or dispatch is None:
        return None
    kind = "global_size" if step.dispatch_kind == "global" else "groups"
    fields = [{f.name for f in interfaces[v.name].push_fields} for v in step_variants]
    conditional = any(p.key not in names for p in step.push for names in fields)
    return ResolvedStep(
        step_variants,
        tuple(select),
        bind,
        tuple(push),
        tuple(spec),
        (kind, dispatch.code),
        conditional,
    )


def _resolve_routes(op: OpSpec, family: FamilySpec, resolved, scope, x: _Scope):
    routes = []
    for i, route in enumerate(op.routes):
        when = None
        if route.when is not None:
            r = x.code(route.when, scope, "route when")
            when = r.code if r else None
        elif i != len(op.routes) - 1:
            x.errors.append(
                SpecError(route.loc, "only the last route may leave out `when` (it is the otherwise)")
            )
        target = next((o for o in family.ops if o.name == route.op), None)
        if target is None or route.op == op.name or target.routes:
            plain = [o.name for o in family.ops if not o.routes and o.name != op.name]
            x.errors.append(
                SpecError(
                    route.op_loc,
                    f"route names '{route.op}', which is not an op of family '{family.name}' "
                    f"that dispatches shaders{did_you_mean(route.op, plain)}; expected one of: "
                    f"{', '.join(plain) or '(none)'}",
                )
            )
            continue
        if target.schema is not None and target.schema.args != op.schema.args:
            x.errors.append(
                SpecError(
                    route.op_loc,
                    f"route op '{route.op}' must take the same arguments as '{op.name}' "
                    f"(names, types, defaults, order)",
                )
            )
            continue
        if route.op in resolved:
            routes.append((when, route.op))
    if routes and op.routes[-1].when is not None:
        x.errors.append(
            SpecError(
                op.routes[-1].loc,
                "the last route must leave out `when`, so every call has an op to go to",
            )
        )
    return routes


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


def _check_bind(step: StepSpec, who, step_variants, interfaces, names, errors):
    args, tensor_args, lets, outputs, scratch = names
    bound = {b.key: b for b in step.bind}
    shader_bindings = []
    for v in step_variants:
        for slot in interfaces[v.name].bindings:
            if slot.name not in shader_bindings:
                shader_bindings.append(slot.name)
    for b in step.bind:
        name = b.value.text
        if b.key not in shader_bindings:
            errors.append(
                SpecError(
                    b.loc,
                    f"bind names unknown binding '{b.key}'"
                    f"{did_you_mean(b.key, shader_bindings)}; the variants of {who} "
                    f"have: {', '.join(shader_bindings)}",
                )
            )
        elif any(all(s.name != b.key for s in interfaces[v.name].bindings) for v in step_variants):
            errors.append(
                SpecError(
                    b.loc,
                    f"binding '{b.key}' exists in only some variants of {who}; "
                    "fix its `when` or the `fixed` values",
                )
            )
        if name in args and name not in tensor_args:
            errors.append(
                SpecError(b.value.loc, f"bind {b.key}: argument '{name}' is not a Tensor")
            )
        elif name not in args and name not in lets and name not in outputs | scratch:
            choices = sorted(set(tensor_args) | set(lets) | outputs | scratch)
            errors.append(
                SpecError(
                    b.value.loc,
                    f"bind {b.key}: unknown name '{name}'"
                    f"{did_you_mean(name, choices)}; expected a Tensor argument, a let, "
                    f"an output or a scratch: {', '.join(choices)}",
                )
            )
    missing = [n for n in shader_bindings if n not in bound]
    if missing:
        errors.append(
            SpecError(
                step.bind_loc,
                f"bind of {who} does not cover binding(s) "
                f"{', '.join(missing)} of its variants; add them to bind",
            )
        )
    order = {n: i for i, n in enumerate(shader_bindings)}
    result = []
    for b in sorted(step.bind, key=lambda b: order.get(b.key, len(order))):
        name = b.value.text
        kind = (
            "output" if name in outputs
            else "scratch" if name in scratch
            else "let" if name in lets
            else "arg"
        )
        result.append((b.key, name, kind))
    return tuple(result)


def _check_push(step: StepSpec, who, step_variants, interfaces, errors):
    given = {p.key for p in step.push}
    needed: list[str] = []
    for v in step_variants:
        for f in interfaces[v.name].push_fields:
            if f.name not in needed:
                needed.append(f.name)
    missing = [n for n in needed if n not in given]
    if missing:
        errors.append(
            SpecError(
                step.push_loc,
                f"push of {who} does not cover push constant(s) "
                f"{', '.join(missing)} of its variants; add them to push",
            )
        )
    for p in step.push:
        if p.key not in needed:
            errors.append(
                SpecError(
                    p.loc,
                    f"push sets '{p.key}', which no variant of {who} "
                    f"declares{did_you_mean(p.key, needed)}; declared: {', '.join(needed) or '(none)'}",
                )
            )
