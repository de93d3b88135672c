"""Write planned outputs (only what changed) and compare them with what is on disk.

A plan is `{relative path: text}` for everything `generate` produces, built in
full before anything is written. `write_plan` writes changed files with LF
endings and deletes orphans (stale generated files no spec produces any more);
`compare_plan` reports stale, missing and orphan files with a unified diff for
`check`. Orphans are files under `glsl/` (*.comp) and `ops/` (*.py except
__init__.py) that the plan does not contain. Must not render or compile.
Called by `__main__.py`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

OWNED = (("glsl", "*.comp"), ("ops", "*.py"))
KEEP = ("__init__.py",)


@dataclass(frozen=True)
class Drift:
    path: str  # relative to the output folder
    kind: str  # "stale", "missing" or "orphan"
    diff: str


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def orphans(out_dir: Path, plan: dict[str, str]) -> list[str]:
    """Generated-looking files under the output folder that the plan does not produce."""
    found = []
    for sub, pattern in OWNED:
        folder = out_dir / sub
        if folder.is_dir():
            for p in folder.glob(pattern):
                rel = f"{sub}/{p.name}"
                if rel not in plan and p.name not in KEEP:
                    found.append(rel)
    return sorted(found)


def write_plan(out_dir: Path, plan: dict[str, str]) -> tuple[list[str], list[str]]:
    """Writes changed files and removes orphans; returns (written, removed) relative paths."""
    written = []
    for rel in sorted(plan):
        path = out_dir / rel
        data = plan[rel].encode("utf-8")
        try:
            if path.read_bytes() == data:
                continue
        except OSError:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(rel)
    removed = orphans(out_dir, plan)
    for rel in removed:
        (out_dir / rel).unlink()
    return written, removed


def compare_plan(out_dir: Path, plan: dict[str, str], display: str) -> list[Drift]:
    """Differences between the plan and the output folder (`display` prefixes diff paths)."""
    drift = []
    for rel in sorted(plan):
        current = _read(out_dir / rel)
        if current != plan[rel]:
            kind = "missing" if current is None else "stale"
            diff = _diff(current or "", plan[rel], f"a/{display}/{rel}", f"b/{display}/{rel}")
            drift.append(Drift(rel, kind, diff))
    for rel in orphans(out_dir, plan):
        diff = _diff(_read(out_dir / rel) or "", "", f"a/{display}/{rel}", "/dev/null")
        drift.append(Drift(rel, "orphan", diff))
    return drift


def _diff(old: str, new: str, old_name: str, new_name: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), old_name, new_name
        )
    )
