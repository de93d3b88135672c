"""Golden error texts: each golden/<case>.yaml is generated alone, or the spec files of a folder
golden/<case>/ together (errors across files: imports); stderr must equal golden/<case>.txt.

Set UPDATE_GOLDEN=1 to rewrite the .txt files after an intended message change.
"""

from __future__ import annotations

import os

import pytest
from codegen_testlib import HERE, make_tree, run_cli

GOLDEN = HERE / "golden"
CASES = sorted([p.stem for p in GOLDEN.glob("*.yaml")] + [p.name for p in GOLDEN.iterdir() if p.is_dir()])


def case_specs(case: str) -> dict[str, str]:
    """The spec files of a case: golden/<case>.yaml, or every YAML file of golden/<case>/."""
    folder = GOLDEN / case
    if folder.is_dir():
        return {p.name: p.read_text() for p in sorted(folder.glob("*.yaml"))}
    return {f"{case}.yaml": (GOLDEN / f"{case}.yaml").read_text()}


@pytest.mark.parametrize("case", CASES)
def test_golden_error(case, tmp_path, capsys):
    tree = make_tree(tmp_path, case_specs(case))
    status, _, err = run_cli("generate", tree, capsys=capsys)
    expected_path = GOLDEN / f"{case}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        expected_path.write_text(err)
    assert status == 1
    assert "Traceback" not in err
    assert err == expected_path.read_text()


def test_every_case_has_a_golden_text():
    assert CASES
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == CASES
