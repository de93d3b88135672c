"""Check one step of an op against its shader and rewrite its expressions into stub code.

The shader exists, `fixed` and `select` name real axes and values, `select`
covers exactly the non-fixed axes, the step has variants, `spec` names the
shader's spec constants, and `bind` and `push` cover the interface of every
variant of the step. Produces `model.ResolvedStep`. Pure: no files, no
templates. Called by `validate.py`, whose `_Scope` it uses to rewrite
expressions.
"""

from __future__ import annotations

from codegen.errors import SpecError, did_you_mean
from codegen.model import ResolvedStep, StepSpec
from codegen.variants import check_axis_refs, matches


def resolve_step(step: StepSpec, who, family, variants, interfaces, scope, full, names, x):
    """The `ResolvedStep` of one step, or None (errors go to `x.errors`).

    Args:
        who: how errors name the step ("op 'q'" or "step 2 of op 'q'").
        scope: names `select` may use (arguments and lets); `full` adds outputs
            and scratch for `spec`, `push` and `dispatch`.
        names: (arguments, Tensor arguments, lets -> their names, outputs, scratch).
        x: the op's `validate._Scope`, which rewrites expressions.
    """
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
