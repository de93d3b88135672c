"""The shader library: manifest records, runnable(), SPIR-V lookup; the on-disk pipeline cache."""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace

import pytest

from runtime.device import Device, get_device
from runtime.pipeline import spec_values
from runtime.shaders import ManifestError, ShaderLibrary, get_library


def test_manifest_records(tiny_library):
    variant = tiny_library.variant("affine_buffer_float")
    assert (variant.shader, variant.ops, variant.axes) == ("affine", ("test.affine_buffer_float.default",),
                                                          {"STORAGE": "buffer"})
    assert variant.interface.workgroup == (64, 1, 1) and variant.interface.push_constants_size == 64
    assert [(f.name, f.type, f.offset) for f in variant.interface.push_constants][-1] == ("mask", "uvec4", 48)
    assert variant.binding("t_in").access == "read" and variant.binding("t_out").binding == 0
    assert variant.glsl.read_text().startswith("#version 450")
    assert [v.name for v in tiny_library.variants()] == sorted(["affine_buffer_float", "group_ids_buffer_int32",
                                                                "add_texture3d_int8"])
    assert tiny_library.ops()["test.add_texture3d_int8.default"]["variants"] == ["add_texture3d_int8"]


def test_unknown_names(tiny_library):
    with pytest.raises(KeyError, match="variant affine_buffer_float has no binding 't_x'; its bindings: t_out, t_in"):
        tiny_library.variant("affine_buffer_float").binding("t_x")
    with pytest.raises(KeyError, match="no shader variant 'nope'"):
        tiny_library.variant("nope")


def test_missing_manifest(tmp_path):
    with pytest.raises(ManifestError, match="manifest.json.*run `python -m codegen generate`"):
        ShaderLibrary(tmp_path)


def test_get_library_follows_the_environment(tiny_dirs, monkeypatch):
    monkeypatch.setenv("ETVK_GENERATED_DIR", str(tiny_dirs[0]))
    assert get_library() is get_library() and get_library().root == tiny_dirs[0]


@pytest.mark.parametrize("variant, features, formats, ok, reason", [
    ("affine_buffer_float", set(), set(), True, ""),
    ("add_texture3d_int8", set(), {"rgba8i"}, True, ""),
    ("add_texture3d_int8", set(), {"rgba32f"}, False, "lacks storage images of rgba8i"),
    ("group_ids_buffer_int32", {"shader_int8"}, set(), True, ""),
    ("group_ids_buffer_int32", set(), set(), False, "lacks integer_dot_product, shader_int8"),
])
def test_runnable(tiny_library, variant, features, formats, ok, reason):
    info = tiny_library.variant(variant)
    if variant == "group_ids_buffer_int32":
        info = replace(info, requires=("integer_dot_product", "shader_int8") if not features else ("shader_int8",))
    caps = replace(get_device().caps, features=frozenset(features), storage_image_formats=frozenset(formats))
    got_ok, got_reason = tiny_library.runnable(info, caps)
    assert got_ok == ok and got_reason.endswith(reason) and (ok or got_reason.startswith(caps.name))


def test_spirv_from_cache_and_stale_glsl(tiny_dirs, tmp_path, monkeypatch):
    root = tmp_path / "generated"
    shutil.copytree(tiny_dirs[0], root)
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tiny_dirs[1]))
    library = ShaderLibrary(root)
    assert library.spirv("affine_buffer_float")[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path / "empty-cache"))
    glsl = root / "glsl" / "affine_buffer_float.comp"
    glsl.write_text(glsl.read_text() + "// edited\n")
    with pytest.raises(ManifestError, match="does not match .*manifest.json: run `python -m codegen generate`"):
        library.spirv("affine_buffer_float")


def test_spec_values(tiny_library):
    variant = tiny_library.variant("affine_buffer_float")
    assert spec_values(variant, None) == ((0, "I", 64), (1, "I", 1), (2, "I", 1), (3, "i", 0))
    assert spec_values(variant, {"OFFSET": 5})[-1] == (3, "i", 5)


def test_pipeline_cache_is_saved_at_close(tiny_library, tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    shutil.copytree(tiny_dirs[1] / "spv", tmp_path / "spv")
    device = Device(validation=True)
    device.pipelines.get(tiny_library, tiny_library.variant("affine_buffer_float"))
    device.close()
    saved = list((tmp_path / "pipelines").glob("*.bin"))
    assert [p.name for p in saved] == [device.pipelines.path.name] and saved[0].stat().st_size > 0
    reopened = Device(validation=True)
    assert reopened.pipelines.path == device.pipelines.path
    reopened.close()
    assert device.take_validation_messages() == [] and reopened.take_validation_messages() == []


def test_missing_spirv_is_compiled_on_demand(tiny_dirs, tmp_path, monkeypatch):
    """A cache miss calls codegen.glslc.ensure_spirv([(key, glsl, label)], cache_dir) and reads its result."""
    import types

    calls = []

    def ensure_spirv(entries, cache):
        calls.append((entries, cache))
        (key, _, _), = entries
        return {key: tiny_dirs[1] / "spv" / f"{key}.spv"}

    monkeypatch.setitem(sys.modules, "codegen.glslc", types.SimpleNamespace(ensure_spirv=ensure_spirv))
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    library = ShaderLibrary(tiny_dirs[0])
    variant = library.variant("group_ids_buffer_int32")
    assert library.spirv(variant.name)[:4] == b"\x03\x02\x23\x07"
    [(entries, cache)] = calls
    assert cache == tmp_path and entries == [(variant.spirv_key, variant.glsl.read_text(),
                                              f"group_ids_buffer_int32 ({variant.glsl})")]


def test_real_compile_on_demand_matches_glslc(tiny_dirs, tmp_path, monkeypatch):
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    library = ShaderLibrary(tiny_dirs[0])
    variant = library.variant("add_texture3d_int8")
    compiled = library.spirv(variant.name)
    assert (tmp_path / "spv" / f"{variant.spirv_key}.spv").read_bytes() == compiled
    assert compiled == (tiny_dirs[1] / "spv" / f"{variant.spirv_key}.spv").read_bytes()
