"""Expand a shader's axes into variants.

variants = product of all axis values (in axis-value order), minus those
matching an `exclude` entry, plus each explicit `combos` entry (kept even if an
exclude matches it), sorted by axis-value order; then every `overrides` entry
whose `when` matches sets the variant's workgroup / spec-constant defaults
(later entries win). First checks the shader once: every axis reference
(combos, exclude, overrides, `when` and `${AXIS}` of bindings and push
constants), every spec-constant value (defaults and overrides) against its
type, and every required capability. Pure: returns variants and `SpecError`s,
touches no files. Called by `build.py`; tested alone.
"""

from __future__ import annotations

import itertools

from codegen.errors import SpecError, did_you_mean
from codegen.expressions import CAPABILITIES
from codegen.model import AxisMatch, ShaderSpec, SpecConstant, Variant
from codegen.naming import variant_name

# spec-constant type -> (accepts a YAML value, what it expects)
SPEC_VALUE_TYPES = {
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: type(v) is int, "an integer"),
    "uint": (lambda v: type(v) is int and v >= 0, "an integer >= 0"),
    "float": (lambda v: type(v) in (int, float), "a number"),
}


def matches(when: tuple[AxisMatch, ...], axes: dict[str, str]) -> bool:
    """True when every `AXIS: value(s)` entry of `when` holds for the axis values."""
    return all(axes.get(m.axis) in m.values for m in when)


def check_axis_refs(shader: ShaderSpec, refs: tuple[AxisMatch, ...], what: str) -> list[SpecError]:
    """Errors for unknown axes or values in `refs` (fixed/when/exclude/combos entries)."""
    errors = []
    names = [a.name for a in shader.axes]
    for m in refs:
        axis = shader.axis(m.axis)
        if axis is None:
            errors.append(
                SpecError(
                    m.loc,
                    f"unknown axis '{m.axis}' in {what}{did_you_mean(m.axis, names)}; "
                    f"shader '{shader.name}' has axes: {', '.join(names) or '(none)'}",
                )
            )
            continue
        for v in m.values:
            if v not in axis.values:
                errors.append(
                    SpecError(
                        m.value_loc,
                        f"unknown value '{v}' for axis {m.axis} in {what}"
                        f"{did_you_mean(v, axis.values)}; expected one of {', '.join(axis.values)}",
                    )
                )
    return errors


def check_shader(shader: ShaderSpec) -> list[SpecError]:
    """Errors in a shader's own entries, each reported once (not once per variant)."""
    names = [a.name for a in shader.axes]
    errors = []
    for combo in shader.combos:
        errors += check_axis_refs(shader, combo, f"a combo of shader '{shader.name}'")
        given = {m.axis for m in combo}
        missing = [n for n in names if n not in given]
        multi = [m.axis for m in combo if len(m.values) != 1]
        if combo and (missing or multi):
            errors.append(
                SpecError(
                    combo[0].loc,
                    f"a combo must give one value for every axis of shader '{shader.name}'"
                    + (f"; missing: {', '.join(missing)}" if missing else "")
                    + (f"; several values for: {', '.join(multi)}" if multi else ""),
                )
            )
    for entry in shader.exclude:
        errors += check_axis_refs(shader, entry, f"an exclude of shader '{shader.name}'")
    declared: dict[str, SpecConstant] = {}
    for s in shader.spec_constants:
        if s.name in declared:
            errors.append(
                SpecError(
                    s.loc,
                    f"spec constant '{s.name}' of shader '{shader.name}' is declared twice "
                    f"(first at line {declared[s.name].loc.line}); rename one",
                )
            )
        declared.setdefault(s.name, s)
    for s in shader.spec_constants:
        accepts, expected = SPEC_VALUE_TYPES[s.type]
        if not accepts(s.default):
            errors.append(
                SpecError(
                    s.default_loc,
                    f"spec constant '{s.name}' of type {s.type} cannot have the default "
                    f"{s.default!r}; expected {expected}",
                )
            )
    for o in shader.overrides:
        errors += check_axis_refs(shader, o.when, f"an override of shader '{shader.name}'")
        for name, (value, loc) in o.spec_constants.items():
            if name not in declared:
                errors.append(
                    SpecError(
                        loc,
                        f"override sets unknown spec constant '{name}'{did_you_mean(name, declared)}; "
                        f"shader '{shader.name}' declares: {', '.join(declared) or '(none)'}",
                    )
                )
                continue
            type_ = declared[name].type
            accepts, expected = SPEC_VALUE_TYPES[type_]
            if not accepts(value):
                errors.append(
                    SpecError(
                        loc,
                        f"override sets spec constant '{name}' of type {type_} to {value!r}; "
                        f"expected {expected}",
                    )
                )
    for b in shader.bindings:
        errors += check_axis_refs(shader, b.when, f"'when' of binding '{b.name}'")
        for text in (b.dtype, b.storage):
            if text.startswith("${") and shader.axis(text[2:-1]) is None:
                errors.append(
                    SpecError(
                        b.loc,
                        f"binding '{b.name}' uses unknown axis {text}{did_you_mean(text[2:-1], names)}; "
                        f"shader '{shader.name}' has axes: {', '.join(names) or '(none)'}",
                    )
                )
    for p in shader.push_constants:
        errors += check_axis_refs(shader, p.when, f"'when' of push constant '{p.name}'")
    requires = list(zip(shader.requires, shader.requires_locs, strict=True))
    for o in shader.overrides:
        requires += zip(o.requires, o.requires_locs, strict=True)
    for cap, loc in requires:
        if cap not in CAPABILITIES:
            errors.append(
                SpecError(
                    loc,
                    f"unknown capability '{cap}'{did_you_mean(cap, CAPABILITIES)}; "
                    f"expected one of {', '.join(CAPABILITIES)}",
                )
            )
    return errors


def expand_variants(shader: ShaderSpec) -> tuple[list[Variant], list[SpecError]]:
    """All variants of a shader in axis-value order, with overrides applied."""
    errors = check_shader(shader)
    if errors:
        return [], errors
    names = [a.name for a in shader.axes]
    order = {a.name: {v: i for i, v in enumerate(a.values)} for a in shader.axes}
    chosen: dict[tuple[str, ...], None] = {}
    for values in itertools.product(*(a.values for a in shader.axes)):
        axes = dict(zip(names, values, strict=True))
        if not any(matches(entry, axes) for entry in shader.exclude):
            chosen[values] = None
    for combo in shader.combos:
        given = {m.axis: m.values[0] for m in combo}
        chosen[tuple(given[n] for n in names)] = None
    if not chosen:
        return [], [
            SpecError(
                shader.loc,
                f"shader '{shader.name}' expands to no variants; its `exclude` entries remove every "
                "combination (remove an exclude or add a combo)",
            )
        ]
    ordered = sorted(
        chosen, key=lambda vs: tuple(order[n][v] for n, v in zip(names, vs, strict=True))
    )
    variants = []
    for values in ordered:
        axes = dict(zip(names, values, strict=True))
        workgroup = shader.workgroup
        spec_defaults = {s.name: s.default for s in shader.spec_constants}
        requires, extensions = list(shader.requires), list(shader.extensions)
        for o in shader.overrides:
            if matches(o.when, axes):
                workgroup = o.workgroup or workgroup
                spec_defaults.update({k: v for k, (v, _) in o.spec_constants.items()})
                requires += o.requires
                extensions += o.extensions
        variants.append(
            Variant(
                variant_name(shader.name, values),
                shader,
                axes,
                workgroup,
                spec_defaults,
                tuple(dict.fromkeys(requires)),
                tuple(dict.fromkeys(extensions)),
            )
        )
    return variants, []
