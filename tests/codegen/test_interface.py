"""Interface assignment: binding numbers, descriptor types, std430 push offsets, spec ids."""

from __future__ import annotations

import pytest

from codegen.interface import build_interface, glsl_header, interface_dict
from codegen.spec import parse_family
from codegen.variants import expand_variants
from codegen.yaml_loader import load_yaml

SPEC = """
family: f
shaders:
  s:
    template: t.glsl.j2
    axes:
      STORAGE: [buffer, texture3d]
      DTYPE: [float16, uint8]
    bindings:
      - {name: t_out, dtype: "${DTYPE}", storage: "${STORAGE}", access: write}
      - {name: t_extra, dtype: float32, vec: 1, when: {STORAGE: buffer}}
      - {name: t_in, dtype: int32, storage: "${STORAGE}", access: read_write}
    push_constants:
      - {name: a, type: uint}
      - {name: v, type: ivec4}
      - {name: b, type: float, when: {DTYPE: uint8}}
      - {name: c, type: int}
      - {name: w, type: vec4, when: {STORAGE: texture3d}}
    spec_constants:
      - {name: TILE, type: int, default: 4}
      - {name: FAST, type: bool, default: true}
"""


def interfaces():
    root, _ = load_yaml(SPEC, "f.yaml")
    family, errors = parse_family(root, "f.yaml")
    assert not errors
    variants, errors = expand_variants(family.shaders[0])
    assert not errors
    return {v.name: build_interface(v)[0] for v in variants}


IFACES = interfaces()

# variant -> expected (binding name, number, descriptor, format)
BINDINGS = {
    "s_buffer_half": [("t_out", 0, "storage_buffer", None), ("t_extra", 1, "storage_buffer", None), ("t_in", 2, "storage_buffer", None)],
    "s_texture3d_uint8": [("t_out", 0, "storage_image", "rgba8ui"), ("t_in", 1, "storage_image", "rgba32i")],
}
# variant -> expected ((name, offset), ...), size
PUSH = {
    "s_buffer_half": ([("a", 0), ("v", 16), ("c", 32)], 48),
    "s_buffer_uint8": ([("a", 0), ("v", 16), ("b", 32), ("c", 36)], 48),
    "s_texture3d_uint8": ([("a", 0), ("v", 16), ("b", 32), ("c", 36), ("w", 48)], 64),
}


@pytest.mark.parametrize("name", sorted(BINDINGS))
def test_bindings(name):
    got = [(b.name, b.binding, b.descriptor, b.format) for b in IFACES[name].bindings]
    assert got == BINDINGS[name]


@pytest.mark.parametrize("name", sorted(PUSH))
def test_push_offsets(name):
    iface = IFACES[name]
    assert [(f.name, f.offset) for f in iface.push_fields] == PUSH[name][0]
    assert iface.push_size == PUSH[name][1]


def test_spec_constant_ids_and_manifest_dict():
    d = interface_dict(IFACES["s_buffer_half"])
    assert d["spec_constants"] == [
        {"name": "TILE", "id": 3, "type": "int", "default": 4},
        {"name": "FAST", "id": 4, "type": "bool", "default": True},
    ]
    assert d["workgroup"] == [64, 1, 1]
    assert d["bindings"][1] == {
        "name": "t_extra", "binding": 1, "storage": "buffer", "dtype": "float32", "vec": 1,
        "access": "read", "descriptor": "storage_buffer",
    }


def test_scalar_only_push():
    root, _ = load_yaml(SPEC.replace("type: ivec4", "type: uint").replace("type: vec4", "type: int"), "f.yaml")
    family, _ = parse_family(root, "f.yaml")
    variants, _ = expand_variants(family.shaders[0])
    iface = build_interface(variants[0])[0]
    assert [f.offset for f in iface.push_fields] == [0, 4, 8]
    assert iface.push_size == 12


def test_vec1_needs_32_bit_buffer():
    root, _ = load_yaml(SPEC.replace("dtype: float32, vec: 1", "dtype: float16, vec: 1"), "f.yaml")
    family, _ = parse_family(root, "f.yaml")
    variants, _ = expand_variants(family.shaders[0])
    iface, errors = build_interface(variants[0])
    assert iface is None
    assert "vec: 1 needs a 32-bit dtype" in errors[0].message


WIDE_SPEC = """
family: f
shaders:
  s:
    template: t.glsl.j2
    axes:
      STORAGE: [buffer, texture3d]
    bindings:
      - {name: t_out, dtype: int8, storage: "${STORAGE}", access: write}
      - {name: t_in, dtype: int8, wide: true, when: {STORAGE: buffer}}
"""


def _wide_variants(text: str):
    root, _ = load_yaml(text, "f.yaml")
    family, errors = parse_family(root, "f.yaml")
    assert not errors, [e.message for e in errors]
    variants, errors = expand_variants(family.shaders[0])
    assert not errors
    return {v.name: v for v in variants}


def test_wide_buffer_gets_a_16_byte_view_of_the_same_binding():
    variants = _wide_variants(WIDE_SPEC)
    iface, errors = build_interface(variants["s_buffer"])
    assert not errors
    header = glsl_header(iface, "t.glsl.j2", "f.yaml:1")
    assert "layout(set = 0, binding = 1, std430) readonly buffer t_in_block {\n  uint data[];" in header
    assert "layout(set = 0, binding = 1, std430) readonly buffer t_in_wide_block {\n  uvec4 data[];" in header
    assert "uvec4 t_in_load_word4(uint i) { return t_in_wide.data[i]; }" in header
    assert "store_word4" not in header
    assert "wide" not in glsl_header(build_interface(variants["s_texture3d"])[0], "t.glsl.j2", "f.yaml:1")
    # One descriptor: the manifest lists the binding once.
    assert [b["name"] for b in interface_dict(iface)["bindings"]] == ["t_out", "t_in"]


@pytest.mark.parametrize("access, qualifier, load, store", [
    ("write", "writeonly ", False, True),
    ("read_write", "", True, True),
])
def test_wide_written_buffer_gets_a_16_byte_store(access, qualifier, load, store):
    text = WIDE_SPEC.replace("dtype: int8, wide: true", f"dtype: int8, wide: true, access: {access}")
    iface, errors = build_interface(_wide_variants(text)["s_buffer"])
    assert not errors
    header = glsl_header(iface, "t.glsl.j2", "f.yaml:1")
    assert f"layout(set = 0, binding = 1, std430) {qualifier}buffer t_in_wide_block {{\n  uvec4 data[];" in header
    assert ("uvec4 t_in_load_word4(uint i) { return t_in_wide.data[i]; }" in header) == load
    assert ("void t_in_store_word4(uint i, uvec4 w) { t_in_wide.data[i] = w; }" in header) == store


@pytest.mark.parametrize("fields, fault", [
    ("dtype: int32, wide: true", "got int32 in buffer"),
    ("dtype: float16, wide: true, access: write", "got float16 in buffer"),
    ("dtype: int8, storage: texture3d, wide: true", "got int8 in texture3d"),
])
def test_wide_needs_an_int8_buffer(fields, fault):
    text = WIDE_SPEC.replace("dtype: int8, wide: true", fields)
    iface, errors = build_interface(_wide_variants(text)["s_buffer"])
    assert iface is None
    assert "wide needs an int8 or uint8 buffer" in errors[0].message
    assert fault in errors[0].message


def test_wide_must_be_a_boolean():
    root, _ = load_yaml(WIDE_SPEC.replace("wide: true", "wide: 1"), "f.yaml")
    _, errors = parse_family(root, "f.yaml")
    assert [e.message for e in errors] == ["'wide' of a binding of shader 's' must be true or false, got an integer"]
