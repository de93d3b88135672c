"""The drift gate: generate is idempotent; check fails with a diff on stale or orphan files."""

from __future__ import annotations

from codegen_testlib import make_tree, run_cli


def test_generate_check_stale_orphan(tmp_path, capsys):
    tree = make_tree(tmp_path)
    out = tree["out"]
    assert run_cli("generate", tree, "--no-compile", capsys=capsys)[0] == 0
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == [
        "glsl/scale_buffer_float.comp", "glsl/scale_buffer_half.comp", "glsl/scale_texture3d_float.comp",
        "manifest.json", "ops/toy.py",
    ]
    assert run_cli("check", tree, capsys=capsys)[0] == 0

    # Generating again writes nothing (same bytes, same mtimes).
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    status, _, err = run_cli("generate", tree, "--no-compile", capsys=capsys)
    assert status == 0 and "wrote" not in err
    assert mtimes == {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    # A stale file: check exits 1 with a unified diff and the fix command.
    comp = out / "glsl" / "scale_buffer_half.comp"
    comp.write_text(comp.read_text().replace("pc.scale", "pc.scale * 2.0"))
    (out / "glsl" / "old_variant.comp").write_text("// @generated\n")
    status, diff, err = run_cli("check", tree, capsys=capsys)
    assert status == 1
    assert "--- a/generated/glsl/scale_buffer_half.comp" in diff
    assert "-  t_out_store(unit, t_in_load(unit) * pc.scale * 2.0);" in diff
    assert "+  t_out_store(unit, t_in_load(unit) * pc.scale);" in diff
    assert "--- a/generated/glsl/old_variant.comp" in diff
    assert "generated/glsl/scale_buffer_half.comp: stale" in err
    assert "generated/glsl/old_variant.comp: orphan" in err
    assert "make generate" in err

    # generate repairs both; check passes again.
    status, _, err = run_cli("generate", tree, "--no-compile", capsys=capsys)
    assert "removed orphan generated/glsl/old_variant.comp" in err
    assert not (out / "glsl" / "old_variant.comp").exists()
    assert run_cli("check", tree, capsys=capsys)[0] == 0


def test_spec_change_makes_check_fail(tmp_path, capsys):
    tree = make_tree(tmp_path)
    run_cli("generate", tree, "--no-compile", capsys=capsys)
    spec = tree["specs"] / "toy.yaml"
    spec.write_text(spec.read_text().replace("DTYPE: [float32, float16]", "DTYPE: [float32]"))
    status, diff, err = run_cli("check", tree, capsys=capsys)
    assert status == 1
    assert "glsl/scale_buffer_half.comp: orphan" in err
    assert '"scale_buffer_half"' in diff  # the manifest diff
