"""Helpers for codegen tests: temp spec trees and running the CLI in-process."""

from __future__ import annotations

import shutil
from pathlib import Path

from codegen.__main__ import main

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"


def make_tree(root: Path, specs: dict[str, str] | None = None) -> dict[str, Path]:
    """op_specs/ (the given files, or the toy spec), templates/ (fixtures + ops.py.j2), generated/."""
    specs_dir = root / "op_specs"
    templates_dir = root / "templates"
    specs_dir.mkdir(parents=True)
    shutil.copytree(FIXTURES / "templates", templates_dir)
    shutil.copy(REPO / "templates" / "ops.py.j2", templates_dir / "ops.py.j2")
    if specs is None:
        specs = {"toy.yaml": (FIXTURES / "specs" / "toy.yaml").read_text()}
    for name, text in specs.items():
        (specs_dir / name).write_text(text)
    return {"specs": specs_dir, "templates": templates_dir, "out": root / "generated"}


def run_cli(command: str, tree: dict[str, Path], *extra: str, capsys) -> tuple[int, str, str]:
    """Runs `python -m codegen <command>` in-process; returns (status, stdout, stderr)."""
    capsys.readouterr()
    args = [command, "--specs", str(tree["specs"]), "--templates", str(tree["templates"])]
    args += ["--out", str(tree["out"]), *extra]
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err
