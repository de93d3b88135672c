"""Shader libraries: manifest records, format and clash checks, runnable(), SPIR-V lookup; the pipeline cache."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import pytest

from runtime.ops.library import FORMAT, Catalog, ManifestError, ShaderLibrary, environment_dirs
from runtime.vulkan.device import Device, get_device
from runtime.vulkan.pipeline import spec_values


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


def _copy(tiny_dir, tmp_path, name="generated"):
    root = tmp_path / name
    shutil.copytree(tiny_dir, root)
    return root


def _edit_manifest(root, change):
    manifest = json.loads((root / "manifest.json").read_text())
    change(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_another_format_is_refused(tiny_dir, tmp_path):
    root = _copy(tiny_dir, tmp_path)
    _edit_manifest(root, lambda m: m.update(format=1))
    with pytest.raises(ManifestError, match=rf"{root}/manifest.json has format 1 \(generator: tests\); this "
                                            rf"runtime reads format {FORMAT}: regenerate it .*--out {root}"):
        ShaderLibrary(root)


def test_malformed_manifest(tiny_dir, tmp_path):
    root = _copy(tiny_dir, tmp_path)
    _edit_manifest(root, lambda m: m.pop("variants"))
    with pytest.raises(ManifestError, match="manifest.json is malformed \\(missing 'variants'\\)"):
        ShaderLibrary(root)


def test_format_matches_codegen():
    from codegen.naming import MANIFEST_FORMAT

    assert FORMAT == MANIFEST_FORMAT


def test_catalog_refuses_clashes_naming_both_sources(tiny_dir, tmp_path):
    catalog = Catalog([ShaderLibrary(tiny_dir)])
    with pytest.raises(ManifestError, match="already loaded"):
        catalog.add(ShaderLibrary(tiny_dir))
    twin = _copy(tiny_dir, tmp_path, "twin")
    with pytest.raises(ManifestError, match=rf"op test.add_texture3d_int8.default from {twin}/manifest.json "
                                            rf"\(\) clashes with the registered test.add_texture3d_int8.default "
                                            rf"from {tiny_dir}/manifest.json"):
        catalog.add(ShaderLibrary(twin))
    _edit_manifest(twin, lambda m: m.update(ops={}))
    with pytest.raises(ManifestError, match=rf"variant add_texture3d_int8 from {twin}/manifest.json "
                                            rf"\(tests/runtime/conftest.py:add_texture3d_int8\) clashes with "
                                            rf"the variant of that name from {tiny_dir}/manifest.json"):
        catalog.add(ShaderLibrary(twin))
    assert [lib.root for lib in catalog.libraries] == [tiny_dir]
    assert catalog.variant("affine_buffer_float").root == tiny_dir
    with pytest.raises(KeyError, match="no shader variant 'nope'"):
        catalog.variant("nope")


def test_environment_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("ETVK_GENERATED_DIR", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    assert environment_dirs() == [tmp_path / "a", tmp_path / "b"]


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
    got_ok, got_reason = info.runnable(caps)
    assert got_ok == ok and got_reason.endswith(reason) and (ok or got_reason.startswith(caps.name))


def test_spirv_missing_and_stale(tiny_dir, tmp_path):
    root = _copy(tiny_dir, tmp_path)
    variant = ShaderLibrary(root).variant("affine_buffer_float")
    assert variant.spirv()[:4] == b"\x03\x02\x23\x07"  # SPIR-V magic
    variant.spirv_path.unlink()
    with pytest.raises(ManifestError, match=rf"variant affine_buffer_float has no SPIR-V \({variant.spirv_path} "
                                            rf"is missing\): run `python -m codegen compile --out {root}`"):
        variant.spirv()
    glsl = root / "glsl" / "affine_buffer_float.comp"
    glsl.write_text(glsl.read_text() + "// edited\n")
    with pytest.raises(ManifestError, match="variant affine_buffer_float: .*affine_buffer_float.comp does not "
                                            "match .*manifest.json \\(edited after generation\\): run "
                                            rf"`python -m codegen generate --out {root}`"):
        variant.spirv()


def test_without_glsl_the_binary_is_used(tiny_dir, tmp_path):
    """An installed wheel ships no GLSL: the manifest's key names the binary."""
    root = _copy(tiny_dir, tmp_path)
    shutil.rmtree(root / "glsl")
    assert ShaderLibrary(root).variant("add_texture3d_int8").spirv()[:4] == b"\x03\x02\x23\x07"


def test_spec_values(tiny_library):
    variant = tiny_library.variant("affine_buffer_float")
    assert spec_values(variant, None) == ((0, "I", 64), (1, "I", 1), (2, "I", 1), (3, "i", 0))
    assert spec_values(variant, {"OFFSET": 5})[-1] == (3, "i", 5)


def test_pipeline_cache_is_saved_at_close(tiny_library, tmp_path, monkeypatch):
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path))
    device = Device(validation=True)
    device.pipelines.get(tiny_library.variant("affine_buffer_float"))
    device.close()
    saved = list((tmp_path / "pipelines").glob("*.bin"))
    assert [p.name for p in saved] == [device.pipelines.path.name] and saved[0].stat().st_size > 0
    reopened = Device(validation=True)
    assert reopened.pipelines.path == device.pipelines.path
    reopened.close()
    assert device.take_validation_messages() == [] and reopened.take_validation_messages() == []
