"""Command line: `python -m codegen generate | check | list | docs`.

generate  render every variant and stub module, write what changed into
          --out (glsl/, ops/, manifest.json), remove orphans, and compile all
          SPIR-V into the cache (skip with --no-compile).
check     exit 1 with a diff and the fix command when --out is stale or has
          orphans; 0 otherwise. Does not compile.
list      print every variant: name, op(s), axis values, spec file:line.
docs      rewrite codegen/README.md from the schema tables (--check: exit 1 if stale).

User errors print compiler-style diagnostics, never a traceback, and exit 1.
This module only parses arguments and calls `build`, `emit`, `docs`.
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
        ("check", "fail if generated/ is stale"),
        ("list", "print every variant"),
        ("docs", "rewrite codegen/README.md"),
    ):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--specs", type=Path, default=REPO / "op_specs", help="spec folder")
        s.add_argument("--templates", type=Path, default=REPO / "templates", help="template folder")
        s.add_argument("--out", type=Path, default=REPO / "generated", help="output folder")
        if name == "generate":
            s.add_argument("--no-compile", action="store_true", help="skip the SPIR-V compile")
        if name == "docs":
            s.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
            s.add_argument("--readme", type=Path, default=REPO / "codegen" / "README.md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from codegen.errors import DiagnosticsError, report

    try:
        return {"generate": _generate, "check": _check, "list": _list, "docs": _docs}[args.command](
            args
        )
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
        compile_plan(result, glslc.cache_dir(), args.out.name)
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


def _list(args) -> int:
    from codegen.build import expand, load_families, ops_by_variant, resolve_ops
    from codegen.errors import Diagnostics

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
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, [*widths, 0], strict=True)) for r in rows]
    sys.stdout.write("".join(line + "\n" for line in out))
    print(f"{len(rows)} variants, {len(result.ops)} ops", file=sys.stderr)
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
