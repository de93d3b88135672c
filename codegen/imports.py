"""Named checks shared across spec files: each file's `imports` joined into its check table.

A spec file's `imports` maps another spec file of the same folder to checks
that file defines in its `checks` (``{q8ta_unary.yaml: [sums_table_int8]}``);
the file's ops then list those names as if they were its own. `resolve_imports`
takes every file's `CheckTable` (`spec.parse_checks`) and returns, per file,
the names its ops may list, recording an error at the import for a file not in
the folder, a name the file does not define (a check it imports itself must be
imported from where it is defined), a name defined here or imported twice, and
a cycle of imports. Data only in, data out: no YAML, no files. Called by
`build.load_families`.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from codegen.errors import Location, SpecError, did_you_mean
from codegen.model import Check, CheckTable


def resolve_imports(
    tables: dict[str, CheckTable | None],
) -> tuple[dict[str, dict[str, Check | None]], list[SpecError]]:
    """`tables`: spec file name (e.g. q8ta_unary.yaml) -> its table, None for a file that
    failed to load (its names import as None: its own errors are reported). Returns (file
    name -> check name -> check, None where the check or its import failed; errors)."""
    errors: list[SpecError] = []
    resolved = {}
    for name, table in tables.items():
        if table is None:
            continue
        checks = dict(table.checks)
        for imp in table.imports:
            if imp.file not in tables:
                folder = PurePosixPath(table.file).parent
                errors.append(
                    SpecError(
                        imp.loc,
                        f"imports: no spec file '{imp.file}' in {folder}/"
                        f"{did_you_mean(imp.file, tables)}; spec files: {', '.join(sorted(tables))}",
                    )
                )
            for check, loc in imp.names:
                if check in table.checks:
                    errors.append(
                        SpecError(
                            loc,
                            f"check '{check}' is imported from {imp.file} but also defined in "
                            "this file's checks; remove the import or rename the local check",
                        )
                    )
                elif check in checks:
                    errors.append(SpecError(loc, f"check '{check}' is imported twice; remove one"))
                else:
                    checks[check] = _imported(tables.get(imp.file), check, loc, errors)
        resolved[name] = checks
    errors += _cycles(tables)
    return resolved, errors


def _imported(
    source: CheckTable | None, check: str, loc: Location, errors: list[SpecError]
) -> Check | None:
    """The check `check` that `source` defines, or None: where `source` is missing or failed
    to load (reported elsewhere), or does not define it (an error recorded at `loc`)."""
    if source is None:
        return None
    if check in source.checks:
        return source.checks[check]
    where = next((i.file for i in source.imports if check in dict(i.names)), None)
    hint = (
        f" (it imports it from {where}; import it from there)"
        if where
        else f"{did_you_mean(check, source.checks)}; its checks: "
        f"{', '.join(source.checks) or '(none)'}"
    )
    errors.append(SpecError(loc, f"{source.file} defines no check '{check}'{hint}"))
    return None


def _cycles(tables: dict[str, CheckTable | None]) -> list[SpecError]:
    """An error at the import that closes each cycle of files importing from each other."""
    errors = []
    state: dict[str, str] = {}  # file -> "open" (on the current path) or "done"
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = "open"
        path.append(name)
        table = tables[name]
        for imp in table.imports if table is not None else ():
            if state.get(imp.file) == "open":
                cycle = [*path[path.index(imp.file):], imp.file]
                errors.append(
                    SpecError(
                        imp.loc,
                        f"imports form a cycle: {' -> '.join(cycle)}; imports go one way: "
                        "define the checks these files share in one of them",
                    )
                )
            elif imp.file in tables and imp.file not in state:
                visit(imp.file)
        path.pop()
        state[name] = "done"

    for name in sorted(tables):
        if name not in state:
            visit(name)
    return errors
