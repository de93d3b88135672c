"""Check each op against its shaders and rewrite its expressions into stub code.

For every op: checks name schema arguments, outputs match the schema's
returns, every expression uses only names in scope, every output and scratch
is bound, and a dispatcher op's routes name ops of the family with the same
arguments. Each step is checked by `steps.py`. Produces `model.ResolvedOp` (what `stubs.py` and
`manifest.py` need). Pure: no files, no templates. Called by `build.py`.
"""

from __future__ import annotations

from codegen.errors import SpecError, did_you_mean
from codegen.expressions import rewrite, rewrite_fstring
from codegen.model import FamilySpec, Interface, OpSpec, Output, ResolvedOp, Variant
from codegen.naming import registry_key
from codegen.steps import resolve_step


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
            # In order of appearance, the same for every op sharing a family check.
            used = [n for n in dict.fromkeys([c.arg, *cond.names, *msg.names]) if n in args]
            checks.append((c.name, c.arg, cond.code, msg.code, tuple(used)))
    scope = set(args)
    lets, let_names = [], {}
    for let in op.lets:
        r = x.code(let.value, scope, f"let {let.key}", uses_lets=False)
        if r:
            lets.append((let.key, r.code))
            let_names[let.key] = r.names
        scope.add(let.key)
    outputs, output_refs = _tensors(op.outputs, "output", scope, set(), x)
    aliases = _aliases(op, schema, x)
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
        r = resolve_step(step, who, family, variants, interfaces, scope, full, names, x)
        if r:
            steps.append(r)
    bound = {b.value.text for s in op.steps for b in s.bind}
    for step in op.steps:
        for b in step.bind:
            if b.value.text in dict(aliases).values():
                output = next(o for o, a in aliases if a == b.value.text)
                err(
                    SpecError(
                        b.loc,
                        f"'{b.value.text}' is written in place as output '{output}'; bind "
                        f"'{b.key}: {output}' instead",
                    )
                )
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
        tuple(aliases),
        tuple(scratch),
        tuple(layouts),
        tuple(steps),
        tuple(routes),
        tuple(lt for lt in lets if lt[0] in needed),
        tuple(sorted(x.modules)),
    ), errors


def _aliases(op: OpSpec, schema, x: _Scope) -> list[tuple[str, str]]:
    """(output, argument) of each output written in place; the argument must be a Tensor
    (not optional) that no other output aliases."""
    out = []
    for o in op.outputs:
        if not o.alias:
            continue
        arg = schema.arg(o.alias)
        tensors = [a.name for a in schema.args if a.type == "Tensor"]
        if arg is None or arg.type != "Tensor":
            x.errors.append(
                SpecError(
                    o.alias_loc,
                    f"alias of output '{o.name}' must name a Tensor argument (not optional) of "
                    f"{schema.name}, got '{o.alias}'{did_you_mean(o.alias, tensors)}; "
                    f"Tensor arguments: {', '.join(tensors) or '(none)'}",
                )
            )
        elif o.alias in dict(out).values():
            x.errors.append(
                SpecError(o.alias_loc, f"'{o.alias}' is the alias of two outputs; keep one")
            )
        else:
            out.append((o.name, o.alias))
    return out


def _tensors(entries, kind: str, scope: set[str], taken: set[str], x: _Scope):
    """Resolved (name, shape code, dtype code) of outputs or scratch, and the names they use
    (an output written in place has its argument's shape and dtype)."""
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
        if isinstance(e, Output) and e.alias:
            out.append((e.name, f"{e.alias}.shape", f"{e.alias}.dtype"))
            refs.append(e.alias)
            continue
        shape = x.code(e.shape, scope, f"{kind} {e.name} shape")
        dtype = x.code(e.dtype, scope, f"{kind} {e.name} dtype")
        if shape and dtype:
            out.append((e.name, shape.code, dtype.code))
            refs += shape.names + dtype.names
    return out, refs


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
