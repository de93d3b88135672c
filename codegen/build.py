"""The generate pipeline: specs -> model -> variants -> interfaces -> ops -> rendered plan.

`load_families` parses every spec file (the checks it imports from another
joined by `imports.py`); `expand` adds variants and interfaces; `build`
validates ops, renders every GLSL variant and stub module, and returns the
full output plan (nothing is written here). `compile_plan`
compiles the planned GLSL through `glslc.ensure_spirv` and maps compile
errors back to generated, template and spec lines. Each stage collects all of
its errors into a `Diagnostics`. Must not write outputs (that is `emit.py`).
Called by `__main__.py`, the benchmark and the tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from codegen import glslc
from codegen.errors import Diagnostics, Location, SpecError
from codegen.imports import resolve_imports
from codegen.interface import build_interface, glsl_header
from codegen.manifest import build_manifest
from codegen.model import FamilySpec, Interface, ResolvedOp, Variant
from codegen.naming import MANIFEST, glsl_path, module_path
from codegen.render import Renderer
from codegen.spec import parse_checks, parse_family
from codegen.stubs import stub_view
from codegen.validate import resolve_op
from codegen.variants import expand_variants
from codegen.yaml_loader import Node, load_yaml

STUB_TEMPLATE = "ops.py.j2"


@dataclass
class VariantOutput:
    variant: Variant
    interface: Interface
    text: str  # the full generated GLSL
    header_lines: int  # lines before the rendered template body
    body: str
    key: str  # SPIR-V cache key


@dataclass
class Build:
    families: list[FamilySpec]
    variants: list[Variant]
    interfaces: dict[str, Interface]
    ops: list[ResolvedOp] = field(default_factory=list)
    outputs: list[VariantOutput] = field(default_factory=list)
    plan: dict[str, str] = field(default_factory=dict)
    renderer: Renderer | None = None


def spec_files(specs_dir: Path) -> list[Path]:
    """The spec files of a folder, sorted."""
    return sorted(p for p in Path(specs_dir).iterdir() if p.suffix in (".yaml", ".yml"))


def load_families(specs_dir: Path, diags: Diagnostics) -> list[FamilySpec]:
    """Parses every spec file, its check names resolved against its own checks and those it
    imports from the folder's other files; families with errors are left out (errors
    recorded)."""
    specs_dir = Path(specs_dir)
    if not specs_dir.is_dir():
        diags.error(Location(str(specs_dir)), "specs folder not found; pass --specs DIR")
        return []
    roots: dict[str, tuple[str, Node | None]] = {}  # file name -> (display path, YAML tree)
    for path in spec_files(specs_dir):
        display = f"{specs_dir.name}/{path.name}"
        root, errors = load_yaml(path.read_text(encoding="utf-8"), display)
        diags.add(errors)
        roots[path.name] = (display, root)
    tables, check_errors = {}, []
    for name, (display, root) in roots.items():
        tables[name], errors = parse_checks(root, display) if root is not None else (None, [])
        check_errors += errors
    checks, errors = resolve_imports(tables)
    check_errors += errors
    diags.add(check_errors)
    failed = {e.location.file for e in check_errors}
    families = []
    seen: dict[str, FamilySpec] = {}
    for name, (display, root) in roots.items():
        if root is None:
            continue
        family, errors = parse_family(root, display, checks[name])
        diags.add(errors)
        if family is None or errors or display in failed:
            continue
        if family.name in seen:
            diags.error(
                family.loc, f"family '{family.name}' is also defined in {seen[family.name].file}"
            )
            continue
        seen[family.name] = family
        families.append(family)
    return families


def expand(families: list[FamilySpec], diags: Diagnostics) -> Build:
    """Variants and interfaces of every shader; duplicate variant names are errors."""
    variants: list[Variant] = []
    interfaces: dict[str, Interface] = {}
    owner: dict[str, Variant] = {}
    for family in families:
        for shader in family.shaders:
            found, errors = expand_variants(shader)
            diags.add(errors)
            for v in found:
                if v.name in owner:
                    other = owner[v.name]
                    diags.error(
                        shader.loc,
                        f"variant name '{v.name}' is produced twice (also by "
                        f"shader '{other.shader.name}' at {other.loc.short()}); rename a shader "
                        "or an axis value",
                    )
                    continue
                interface, errors = build_interface(v)
                diags.add(errors)
                if interface is not None:
                    owner[v.name] = v
                    variants.append(v)
                    interfaces[v.name] = interface
    return Build(families, variants, interfaces)


def resolve_ops(result: Build, diags: Diagnostics) -> None:
    """Validates every op against its shader's variants."""
    by_shader: dict[str, list[Variant]] = {}
    for v in result.variants:
        by_shader.setdefault(v.shader.name, []).append(v)
    seen: dict[str, object] = {}
    for family in result.families:
        family_variants = {s.name: by_shader.get(s.name, []) for s in family.shaders}
        done: dict[str, ResolvedOp] = {}
        # Dispatcher ops last: their routes need the ops they route to resolved.
        for op in sorted(family.ops, key=lambda o: bool(o.routes)):
            if op.name in seen:
                diags.error(op.loc, f"op '{op.name}' is also defined in {seen[op.name].family}")
                continue
            seen[op.name] = op
            resolved, errors = resolve_op(op, family, family_variants, result.interfaces, done)
            diags.add(errors)
            if resolved is not None:
                done[op.name] = resolved
                result.ops.append(resolved)


def ops_by_variant(ops: list[ResolvedOp]) -> dict[str, list[str]]:
    """Variant name -> the sorted registry keys of the ops it serves."""
    served: dict[str, list[str]] = {}
    for op in ops:
        for v in op.variants:
            served.setdefault(v.name, []).append(op.key)
    return {name: sorted(keys) for name, keys in served.items()}


def build(specs_dir: Path, templates_dir: Path) -> Build:
    """Runs the whole pipeline up to the output plan; raises `DiagnosticsError` on errors."""
    diags = Diagnostics()
    families = load_families(specs_dir, diags)
    result = expand(families, diags)
    resolve_ops(result, diags)
    renderer = Renderer(Path(templates_dir))
    result.renderer = renderer
    # One template error breaks every output that uses the template: report it once.
    failed: dict[tuple[Location, str], list[str]] = {}  # (where, message) -> what was rendering
    for v in result.variants:
        shader = v.shader
        context = {
            **v.axes,
            "variant": {"name": v.name, "axes": dict(v.axes)},
            "shader": shader.name,
        }
        body, error = renderer.render(shader.template, context, shader.template_loc)
        if error is not None:
            failed.setdefault((error.location, error.message), []).append(f"variant {v.name}")
            continue
        interface = result.interfaces[v.name]
        header = glsl_header(interface, renderer.path(shader.template), shader.loc.short())
        text = header + "\n" + body
        if not text.endswith("\n"):
            text += "\n"
        key = glslc.spirv_key(text)
        result.outputs.append(VariantOutput(v, interface, text, header.count("\n") + 1, body, key))
        result.plan[glsl_path(v.name)] = text
    for family in families:
        ops = [op for op in result.ops if op.spec.family == family.name]
        if not ops:
            continue
        view = stub_view(family, ops, renderer.path(STUB_TEMPLATE))
        text, error = renderer.render(STUB_TEMPLATE, view, family.loc)
        if error is not None:
            what = f"the stubs of family {family.name}"
            failed.setdefault((error.location, error.message), []).append(what)
            continue
        result.plan[module_path(family.name)] = text
    for (loc, message), whats in failed.items():
        more = f" and {len(whats) - 1} more" if len(whats) > 1 else ""
        diags.error(loc, f"{message} (rendering {whats[0]}{more})")
    diags.check()
    result.plan[MANIFEST] = build_manifest(
        result.ops,
        result.variants,
        result.interfaces,
        {o.variant.name: o.key for o in result.outputs},
        ops_by_variant(result.ops),
    )
    return result


def compile_plan(result: Build, spv_dir: Path, out_display: str, progress: bool = True) -> dict:
    """Compiles every planned variant into `spv_dir`; raises `DiagnosticsError` on failure."""
    items = [(o.key, o.text, o.variant.name) for o in result.outputs]
    try:
        return glslc.ensure_spirv(items, spv_dir, progress=progress)
    except glslc.CompileError as e:
        diags = Diagnostics()
        by_name = {o.variant.name: o for o in result.outputs}
        for f in e.failures:
            out = by_name.get(f.label)
            if out is None:
                diags.error(Location(f.label, f.line), f.message)
                continue
            diags.add([compile_diagnostic(result.renderer, out, f, out_display)])
        diags.check()
        raise  # pragma: no cover - check() always raises here


def compile_diagnostic(
    renderer: Renderer, out: VariantOutput, failure: glslc.CompileFailure, out_display: str
) -> SpecError:
    """A glslc failure as an error naming the generated, template and spec lines."""
    v = out.variant
    generated = Location(f"{out_display}/{glsl_path(v.name)}", failure.line)
    notes = []
    if failure.line > out.header_lines:
        source = renderer.source_location(
            v.shader.template, out.body, failure.line - out.header_lines
        )
        template = renderer.path(v.shader.template)
        notes.append(f"from {source.short()}" if source else f"from {template} (line not found)")
    elif failure.line:
        notes.append("in the generated header (interface declarations)")
    notes.append(f"variant {v.name} of shader '{v.shader.name}' defined at {v.loc.short()}")
    return SpecError(generated, f"{failure.message} (variant {v.name})", tuple(notes))
