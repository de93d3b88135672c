"""Command line: `python -m codegen generate | compile | check | list | docs`.

generate  render every variant and stub module, write what changed into
          --out (glsl/, ops/, manifest.json), remove orphans, and compile all
          SPIR-V into --out/spv/ (skip with --no-compile).
compile   compile the SPIR-V of an existing generated folder (--out) from its
          manifest and GLSL alone, into --out/spv/; what a fresh checkout, the
          tests and the wheel build need. No specs or templates are read.
check     exit 1 with a diff and the fix command when --out is stale or has
          orphans; 0 otherwise. Does not compile.
list      print every variant: name, op(s), axis values, spec file:line;
          --stats: variants, ops and SPIR-V bytes per family and in total.
docs      rewrite codegen/README.md from the schema tables (--check: exit 1 if stale).

--specs, --templates and --out default to the checkout's op_specs/,
templates/ and generated/; a folder of one's own passes all three. Templates
may include the built-in ones (the stub template, templates/include/).
User errors print compiler-style diagnostics, never a traceback, and exit 1.
This module only parses arguments and calls `build`, `emit`, `glslc`, `docs`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m codegen", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (
        ("generate", "write generated/ and compile SPIR-V"),
        ("compile", "compile the SPIR-V of a generated folder"),
        ("check", "fail if generated/ is stale"),
        ("list", "print every variant"),
        ("docs", "rewrite codegen/README.md"),
    ):
        s = sub.add_parser(name, help=helptext)
        if name != "compile":
            s.add_argument("--specs", type=Path, default=REPO / "op_specs", help="spec folder")
            s.add_argument("--templates", type=Path, default=REPO / "templates", help="template folder")
        s.add_argument("--out", type=Path, default=REPO / "generated", help="output folder")
        if name == "generate":
            s.add_argument("--no-compile", action="store_true", help="skip the SPIR-V compile")
        if name == "list":
            s.add_argument("--stats", action="store_true",
                           help="variants, ops and SPIR-V bytes per family and in total")
        if name == "docs":
            s.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
            s.add_argument("--readme", type=Path, default=REPO / "codegen" / "README.md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from codegen.errors import DiagnosticsError, report

    commands = {"generate": _generate, "compile": _compile, "check": _check, "list": _list,
                "docs": _docs}
    try:
        return commands[args.command](args)
    except DiagnosticsError as e:
        return report(e.errors)


def _generate(args) -> int:
    from codegen import emit, glslc
    from codegen.build import build, compile_plan

    result = build(args.specs, args.templates)
    written, removed = emit.write_plan(args.out, result.plan)
    for rel in written:
        print(f"wrote {args.out.name}/{rel}", file=sys.stderr)
    for rel in removed:
        print(f"removed orphan {args.out.name}/{rel}", file=sys.stderr)
    if not args.no_compile:
        paths = compile_plan(result, args.out / "spv", args.out.name)
        for name in glslc.prune(args.out / "spv", paths):
            print(f"removed orphan {args.out.name}/spv/{name}", file=sys.stderr)
    return 0


def _compile(args) -> int:
    from codegen import glslc

    try:
        glslc.compile_folder(args.out, progress=True)
    except glslc.CompileError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _check(args) -> int:
    from codegen import emit
    from codegen.build import build

    result = build(args.specs, args.templates)
    drift = emit.compare_plan(args.out, result.plan, args.out.name)
    if not drift:
        return 0
    for d in drift:
        sys.stdout.write(d.diff)
    for d in drift:
        print(f"{args.out.name}/{d.path}: {d.kind}", file=sys.stderr)
    print(
        f"{args.out.name}/ is out of date ({len(drift)} file(s)); run `make generate` "
        "(python -m codegen generate) and commit the result",
        file=sys.stderr,
    )
    return 1


def _table(rows: list[tuple[str, ...]], right: int = 0) -> str:
    """Rows as aligned columns; the last `right` columns are right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i >= len(r) - right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip() + "\n")
    return "".join(lines)


def _list(args) -> int:
    from codegen.build import build, expand, load_families, ops_by_variant, resolve_ops
    from codegen.errors import Diagnostics

    if args.stats:
        return _stats(build(args.specs, args.templates), args.out)
    diags = Diagnostics()
    result = expand(load_families(args.specs, diags), diags)
    resolve_ops(result, diags)
    diags.check()
    served = ops_by_variant(result.ops)
    rows = [
        (
            v.name,
            ",".join(served.get(v.name, ["-"])),
            " ".join(f"{k}={x}" for k, x in v.axes.items()),
            v.loc.short(),
        )
        for v in result.variants
    ]
    if rows:
        sys.stdout.write(_table(rows))
    print(f"{len(rows)} variants, {len(result.ops)} ops", file=sys.stderr)
    return 0


def _stats(result, out: Path) -> int:
    """Variants, ops and SPIR-V binaries and bytes per family, from the build and `out`/spv."""
    from codegen.glslc import spirv_path

    families: dict[str, dict] = {}
    for o in result.outputs:
        entry = families.setdefault(o.variant.shader.family, {"variants": 0, "keys": set()})
        entry["variants"] += 1
        entry["keys"].add(o.key)
    ops = {}
    for op in result.ops:
        ops[op.spec.family] = ops.get(op.spec.family, 0) + 1
    rows = [("family", "variants", "ops", "SPIR-V binaries", "SPIR-V bytes")]
    missing, total_keys = set(), set()
    for family in sorted(families):
        keys = families[family]["keys"]
        present = [spirv_path(k, out / "spv") for k in sorted(keys)]
        missing |= {p for p in present if not p.exists()}
        size = sum(p.stat().st_size for p in present if p.exists())
        rows.append((family, str(families[family]["variants"]), str(ops.get(family, 0)),
                     str(len(keys)), f"{size:,}"))
        total_keys |= keys
    total_size = sum(p.stat().st_size for k in total_keys if (p := spirv_path(k, out / "spv")).exists())
    rows.append(("total", str(len(result.outputs)), str(len(result.ops)), str(len(total_keys)),
                 f"{total_size:,}"))
    sys.stdout.write(_table(rows, right=4))
    if missing:
        print(f"{len(missing)} binaries are not compiled in {out}/spv (their bytes are not counted): "
              f"run `python -m codegen compile --out {out}`", file=sys.stderr)
    return 0


def _docs(args) -> int:
    from codegen.docs import render_readme

    text = render_readme()
    current = args.readme.read_text(encoding="utf-8") if args.readme.exists() else None
    if args.check:
        if current != text:
            print(f"{args.readme} is stale; run `python -m codegen docs`", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.readme.write_bytes(text.encode("utf-8"))
        print(f"wrote {args.readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
