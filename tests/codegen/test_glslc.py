"""glslc.py: cache key, cache hits, loud failures with labels and lines."""

from __future__ import annotations

import hashlib
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


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    assert glslc.cache_dir() == tmp_path
    monkeypatch.delenv("ETVK_CACHE_DIR")
    assert glslc.cache_dir().parts[-2:] == (".cache", "etvk")


def test_compile_then_hit(tmp_path, monkeypatch):
    key = glslc.spirv_key(GOOD)
    paths = glslc.ensure_spirv([(key, GOOD, "good")], tmp_path)
    assert paths[key] == tmp_path / "spv" / f"{key}.spv"
    assert paths[key].read_bytes()[:4] == b"\x03\x02\x23\x07"
    monkeypatch.setattr(glslc, "_compile_batch", None)  # a cache hit must not compile
    assert glslc.ensure_spirv([(key, GOOD, "good")], tmp_path) == paths


def test_failure_names_label_and_line(tmp_path):
    items = [(glslc.spirv_key(GOOD), GOOD, "good"), (glslc.spirv_key(BAD), BAD, "bad_variant")]
    with pytest.raises(glslc.CompileError) as info:
        glslc.ensure_spirv(items, tmp_path)
    (failure,) = info.value.failures
    assert (failure.label, failure.line) == ("bad_variant", 4)
    assert "'nope' : no matching overloaded function found" in failure.message
    assert not (tmp_path / "spv" / f"{glslc.spirv_key(BAD)}.spv").exists()
    assert (tmp_path / "spv" / f"{glslc.spirv_key(GOOD)}.spv").exists()
