"""Fixtures for runtime tests: a tiny hand-written shader library compiled with glslc.

`tiny_library` writes a generated folder by hand (docs/internals.md section
3): a manifest, GLSL for three variants, and their SPIR-V under `spv/`,
named by key exactly as codegen would (key = sha256(flags + "\\n" + glsl)).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from runtime.ops.library import FORMAT, ShaderLibrary
from runtime.vulkan.stream import Stream

SPIRV_FLAGS = ["--target-env=vulkan1.2", "-O"]
HEADER = """#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
uint etvk_linear_invocation() {
  return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}
uint etvk_linear_group() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }
"""

# name -> (glsl body, interface)
SHADERS = {
    # out = in * scale + bias + shift + OFFSET, per vec4 unit; exercises every push type
    "affine_buffer_float": ("""
layout(constant_id = 3) const int OFFSET = 0;
layout(push_constant) uniform PushConstants { uint numel; float scale; int neg; vec4 bias; ivec4 shift; uvec4 mask; } pc;
layout(set = 0, binding = 0) writeonly buffer t_out_buf { vec4 t_out[]; };
layout(set = 0, binding = 1) readonly buffer t_in_buf { vec4 t_in[]; };
void main() {
  uint u = etvk_linear_invocation();
  if (u >= (pc.numel + 3u) / 4u) return;
  t_out[u] = t_in[u] * pc.scale + pc.bias + vec4(pc.shift) + vec4(pc.mask) + float(pc.neg + OFFSET);
}
""", {
        "workgroup": [64, 1, 1],
        "bindings": [
            {"name": "t_out", "binding": 0, "storage": "buffer", "dtype": "float32", "vec": 4, "access": "write"},
            {"name": "t_in", "binding": 1, "storage": "buffer", "dtype": "float32", "vec": 4, "access": "read"},
        ],
        "push_constants": {"size": 64, "fields": [
            {"name": "numel", "type": "uint", "offset": 0}, {"name": "scale", "type": "float", "offset": 4},
            {"name": "neg", "type": "int", "offset": 8}, {"name": "bias", "type": "vec4", "offset": 16},
            {"name": "shift", "type": "ivec4", "offset": 32}, {"name": "mask", "type": "uvec4", "offset": 48}]},
        "spec_constants": [{"name": "OFFSET", "id": 3, "type": "int", "default": 0}],
    }),
    # t_out[g] = g for every workgroup g < count (workgroup size 1): exercises folding
    "group_ids_buffer_int32": ("""
layout(push_constant) uniform PushConstants { uint count; } pc;
layout(set = 0, binding = 0) writeonly buffer t_out_buf { int t_out[]; };
void main() {
  uint g = etvk_linear_group();
  if (g >= pc.count) return;
  t_out[g] = int(g);
}
""", {
        "workgroup": [1, 1, 1],
        "bindings": [{"name": "t_out", "binding": 0, "storage": "buffer", "dtype": "int32", "vec": 1, "access": "write"}],
        "push_constants": {"size": 4, "fields": [{"name": "count", "type": "uint", "offset": 0}]},
        "spec_constants": [],
    }),
    # out = in + add (+ 1 where the optional t_extra binding is bound), texel-wise on rgba8i images
    "add_texture3d_int8": ("""
layout(push_constant) uniform PushConstants { int add; } pc;
layout(set = 0, binding = 0, rgba8i) uniform writeonly iimage3D t_out;
layout(set = 0, binding = 1, rgba8i) uniform readonly iimage3D t_in;
layout(set = 0, binding = 2, rgba8i) uniform readonly iimage3D t_extra;
void main() {
  ivec3 p = ivec3(gl_GlobalInvocationID);
  if (any(greaterThanEqual(p, imageSize(t_out)))) return;
  imageStore(t_out, p, imageLoad(t_in, p) + imageLoad(t_extra, ivec3(0)) + ivec4(pc.add));
}
""", {
        "workgroup": [4, 4, 1],
        "bindings": [
            {"name": "t_out", "binding": 0, "storage": "texture3d", "dtype": "int8", "vec": 4, "access": "write"},
            {"name": "t_in", "binding": 1, "storage": "texture3d", "dtype": "int8", "vec": 4, "access": "read"},
            {"name": "t_extra", "binding": 2, "storage": "texture3d", "dtype": "int8", "vec": 4, "access": "read"},
        ],
        "push_constants": {"size": 4, "fields": [{"name": "add", "type": "int", "offset": 0}]},
        "spec_constants": [],
    }),
}


def spirv_key(glsl: str) -> str:
    return hashlib.sha256((" ".join(SPIRV_FLAGS) + "\n" + glsl).encode()).hexdigest()


def write_library(root, requires=None):
    """Write manifest, GLSL and SPIR-V (spv/) for SHADERS under `root`. Returns root."""
    (root / "glsl").mkdir(parents=True, exist_ok=True)
    (root / "spv").mkdir(parents=True, exist_ok=True)
    variants = {}
    for name, (body, interface) in SHADERS.items():
        glsl = HEADER + body
        (root / "glsl" / f"{name}.comp").write_text(glsl)
        key = spirv_key(glsl)
        subprocess.run(["glslc", *SPIRV_FLAGS, "-fshader-stage=compute", "-o", str(root / "spv" / f"{key}.spv"),
                        str(root / "glsl" / f"{name}.comp")], check=True)
        variants[name] = {
            "shader": name.split("_")[0], "ops": [f"test.{name}.default"], "axes": {"STORAGE": name.split("_")[-2]},
            "glsl": f"glsl/{name}.comp", "spirv": key, "requires": (requires or {}).get(name, []),
            "spec": f"tests/runtime/conftest.py:{name}", "interface": interface}
    ops = {f"test.{n}.default": {"family": "test", "schema": "", "doc": "", "reference": "",
                                 "module": "ops/test.py", "spec": "", "variants": [n]} for n in SHADERS}
    manifest = {"format": FORMAT, "generator": "tests", "spirv_flags": SPIRV_FLAGS, "ops": ops, "variants": variants}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return root


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """The generated folder of the tiny library, with its compiled SPIR-V."""
    if shutil.which("glslc") is None:
        pytest.fail("glslc is needed to build the tiny test shaders: install glslc (shaderc)")
    return write_library(tmp_path_factory.mktemp("tiny") / "generated")


@pytest.fixture
def tiny_library(tiny_dir):
    """A ShaderLibrary of SHADERS."""
    return ShaderLibrary(tiny_dir)


@pytest.fixture
def stream(tiny_library):
    """A Stream on the process device (the tests dispatch the tiny library's variants)."""
    with Stream() as s:
        yield s


@pytest.fixture
def recorded(monkeypatch):
    """The signatures `Stream._record` wrote into command buffers during the test, in order; the
    process device keeps the test's recordings in a cache of its own (none kept from other tests),
    and op calls go through streams every time (call plans off: runtime/ops/plans.py)."""
    from runtime.ops.plans import plans_for
    from runtime.vulkan.device import RECORDINGS, get_device
    from runtime.vulkan.recordings import Recordings

    monkeypatch.setattr(plans_for(get_device()), "enabled", False)

    written, record = [], Stream._record

    def counting(self, signature):
        written.append(signature)
        record(self, signature)

    monkeypatch.setattr(Stream, "_record", counting)
    cache = Recordings(RECORDINGS)
    monkeypatch.setattr(get_device(), "recordings", cache)
    yield written
    cache.close()
