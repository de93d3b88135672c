"""CLI behaviour: list, docs --check, user errors without tracebacks, ruff-clean stubs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from codegen_testlib import FIXTURES, REPO, make_tree, run_cli

from codegen.__main__ import main
from codegen.docs import render_readme


def test_list(tmp_path, capsys):
    tree = make_tree(tmp_path)
    status, out, err = run_cli("list", tree, capsys=capsys)
    assert status == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == [
        "scale_buffer_float", "etvk.scale.default", "STORAGE=buffer", "DTYPE=float32", "op_specs/toy.yaml:10",
    ]
    assert "3 variants, 1 ops" in err


def test_list_real_specs(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "quantize_per_tensor_buffer_float_int8" in out
    assert "op_specs/quantize.yaml:" in out


def test_docs_check(tmp_path, capsys):
    assert main(["docs", "--check"]) == 0, "codegen/README.md is stale: run python -m codegen docs"
    readme = tmp_path / "README.md"
    readme.write_text("old\n")
    assert main(["docs", "--check", "--readme", str(readme)]) == 1
    assert main(["docs", "--readme", str(readme)]) == 0
    assert readme.read_text() == render_readme()
    assert main(["docs", "--check", "--readme", str(readme)]) == 0


def test_missing_specs_folder_is_a_user_error(tmp_path, capsys):
    status = main(["generate", "--specs", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 1
    assert "specs folder not found" in err and "Traceback" not in err


def test_errors_from_several_files_are_reported_together(tmp_path, capsys):
    bad = "family: a\nshaders: {}\nops: {}\nbogus: 1\n"
    tree = make_tree(tmp_path, {"a.yaml": bad, "b.yaml": bad.replace("family: a", "family: [b]")})
    status, _, err = run_cli("check", tree, capsys=capsys)
    assert status == 1
    assert err.splitlines() == [
        "op_specs/a.yaml:4:1: error: unknown key 'bogus' in the family file; allowed keys: family, doc, imports, checks, shaders, ops",
        "op_specs/b.yaml:1:9: error: family must be a lower_case name, got a list",
        "op_specs/b.yaml:4:1: error: unknown key 'bogus' in the family file; allowed keys: family, doc, imports, checks, shaders, ops",
        "3 errors",
    ]


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
                    reason="ruff not installed")
def test_generated_stubs_are_ruff_clean(tmp_path, capsys):
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    toy = make_tree(tmp_path / "toy")
    real = {"specs": REPO / "op_specs", "templates": REPO / "templates", "out": tmp_path / "real"}
    files = []
    for tree in (toy, real):
        assert run_cli("generate", tree, "--no-compile", capsys=capsys)[0] == 0
        files += sorted((tree["out"] / "ops").glob("*.py"))
    proc = subprocess.run(
        [ruff, "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), *map(str, files)],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stub_labels_name_arguments_values_and_outputs(tmp_path, capsys):
    """Upload and allocation errors say which kind of name they are about."""
    toy = (FIXTURES / "specs" / "toy.yaml").read_text()
    toy = toy.replace("    bind: {t_out: out, t_in: input}", "    bind: {t_out: out, t_in: source}")
    toy = toy.replace("    let:\n", "    let:\n      source: input\n")
    tree = make_tree(tmp_path, {"toy.yaml": toy})
    status, _, err = run_cli("generate", tree, "--no-compile", capsys=capsys)
    assert status == 0, err
    stub = (tree["out"] / "ops" / "toy.py").read_text()
    assert 'source = stream.upload(source, v.binding("t_in"), op.label("source", "value"))' in stub
    assert 'op.label("out", "output")' in stub
