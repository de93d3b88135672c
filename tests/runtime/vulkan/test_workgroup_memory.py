"""Shared memory of a specialized kernel read from its SPIR-V (runtime/vulkan/workgroup_memory.py),
and the pipeline check that refuses a setting over the device's limit."""

from __future__ import annotations

import re
import struct
import subprocess

import pytest

from codegen.glslc import SPIRV_FLAGS
from runtime.errors import UnsupportedVariant
from runtime.ops.library import catalog
from runtime.vulkan.device import get_device
from runtime.vulkan.pipeline import spec_values
from runtime.vulkan.workgroup_memory import SpirvError, workgroup_memory_bytes

# Every layout rule once: vec3 aligned as vec4, a bool as 4 bytes, a struct's inner padding,
# int8 values, lengths from the workgroup size and from spec-constant expressions (SDiv rounds
# toward zero, Select picks by a spec bool).
SHADER = """#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
layout(local_size_x_id = 0) in;
layout(constant_id = 3) const int ROWS = 4;
layout(constant_id = 4) const bool WIDE = false;
layout(constant_id = 5) const int NEG = -7;
struct S { float x; vec2 y; };
shared vec3 a[ROWS];
shared float b;
shared bool flag;
shared S s[2];
shared uint c[WIDE ? 2 * ROWS : ROWS * 8 + NEG / 2];
shared uint d[gl_WorkGroupSize.x / 2u];
shared uint8_t e[3];
layout(std430, binding = 0) buffer Out { float v[]; } o;
void main() {
  uint i = gl_LocalInvocationID.x;
  a[i % ROWS] = vec3(i); b = float(i); flag = i > 3u; s[i & 1u].x = float(i); s[i & 1u].y = vec2(i);
  c[i % c.length()] = i; d[i % d.length()] = i; e[i % 3u] = uint8_t(i);
  barrier();
  o.v[i] = a[(i + 1u) % ROWS].y + b + (flag ? 1.0 : 0.0) + s[(i + 1u) & 1u].y.x
      + float(c[(i + 1u) % c.length()] + d[(i + 1u) % d.length()] + uint(e[(i + 1u) % 3u]));
}
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory) -> bytes:
    folder = tmp_path_factory.mktemp("workgroup_memory")
    (folder / "t.comp").write_text(SHADER)
    subprocess.run(["glslc", *SPIRV_FLAGS, "-o", str(folder / "t.spv"), str(folder / "t.comp")], check=True)
    return (folder / "t.spv").read_bytes()


def test_layout_with_the_defaults(module):
    # a 4 x 16 | b 4 | flag 4 | s: 2 x 16, at 72 (8-aligned) | c: 32 - 3 = 29 x 4 | d: 32 x 4 | e: 3
    assert workgroup_memory_bytes(module, ((0, "I", 64),)) == 64 + 4 + 4 + 32 + 116 + 128 + 3


def test_layout_specialized(module):
    specs = ((0, "I", 128), (3, "i", 2), (4, "I", 1), (5, "i", -9))
    # a 2 x 16 | b | flag | s at 40 | c: WIDE, 2 * 2 x 4 | d: 64 x 4 | e: 3
    assert workgroup_memory_bytes(module, specs) == 32 + 4 + 4 + 32 + 16 + 256 + 3
    # SDiv rounds toward zero: (-9) / 2 = -4, so c holds 2 * 8 - 4 = 12 words
    assert workgroup_memory_bytes(module, ((0, "I", 64), (3, "i", 2), (5, "i", -9))) == (
        32 + 4 + 4 + 32 + 48 + 128 + 3)


def test_every_catalog_variant_is_read():
    """Every shipped variant evaluates with its defaults: none is left to the driver's check."""
    for variant in catalog().variants():
        assert workgroup_memory_bytes(variant.spirv(), spec_values(variant, None)) >= 0, variant.name


@pytest.mark.parametrize("tiling", [(4, 1, 8, 1, 8), (4, 1, 16, 2, 8), (4, 1, 8, 8, 4),
                                    (4, 1, 4, 16, 4), (4, 2, 8, 1, 8)])
def test_gemm_tilings_as_the_template_declares(tiling):
    """q8ta_gemm's staging arrays (templates/q8ta_gemm.glsl.j2): K words of A rows and of B
    columns, 16 bytes each, plus the split-K reduction (a 16-byte placeholder without one)."""
    tile_m, tile_n4, threads_n, split_k, block_k = tiling
    rows = 256 // split_k // threads_n
    kc = split_k * block_k
    want = kc * (tile_m * rows // 4) * 16 + kc * tile_n4 * threads_n * 16
    want += 256 // 2 * tile_m * tile_n4 * 16 if split_k > 1 else 16
    variant = catalog().variant("q8ta_gemm_fallback")
    specs = spec_values(variant, dict(zip(("TILE_M", "TILE_N4", "THREADS_N", "SPLIT_K", "BLOCK_K"),
                                          tiling, strict=True)))
    assert workgroup_memory_bytes(variant.spirv(), specs) == want


@pytest.mark.parametrize("steps", [2, 4, 8])
def test_coop_linear_as_the_template_declares(steps):
    """linear_qta8a_qga4w_coop's shared memory (templates/linear_qta8a_qga4w_coop.glsl.j2): 32
    token rows and 64 weight rows of 8 STEPS + 4 words, each step's 64 scales and c, and the
    tile's 32 zero points (its epilogue scales the sums in registers). 8,832 bytes at STEPS 2."""
    want = (32 + 64) * (8 * steps + 4) * 4 + 2 * steps * 64 * 4 + 32 * 4
    variant = catalog().variant("linear_qta8a_qga4w_coop_buffer")
    assert workgroup_memory_bytes(variant.spirv(), spec_values(variant, {"STEPS": steps})) == want


def test_not_spirv():
    with pytest.raises(SpirvError, match="not a SPIR-V module: magic 0x64636261"):
        workgroup_memory_bytes(b"abcd" * 8)
    with pytest.raises(SpirvError, match="not a SPIR-V module: 6 bytes"):
        workgroup_memory_bytes(b"\x03\x02\x23\x07\x00\x00")


def test_truncated(module):
    words = struct.unpack(f"<{len(module) // 4}I", module)
    at = 5
    while words[at] & 0xFFFF != 59:  # the first OpVariable: 4 words
        at += words[at] >> 16
    with pytest.raises(SpirvError, match=f"truncated SPIR-V instruction at word {at}"):
        workgroup_memory_bytes(module[:4 * (at + 2)])
    with pytest.raises(SpirvError, match="truncated SPIR-V: no function after the declarations"):
        workgroup_memory_bytes(module[:4 * at])


def test_an_unevaluated_length_is_named(module):
    """An OpSpecConstantOp outside the integer and logic ops (here SDiv turned into FMul's 133)."""
    words = list(struct.unpack(f"<{len(module) // 4}I", module))
    at = next(i for i in range(5, len(words) - 3)
              if words[i] & 0xFFFF == 52 and words[i + 3] == 135)  # OpSpecConstantOp SDiv
    words[at + 3] = 133
    with pytest.raises(SpirvError, match=r"OpSpecConstantOp with opcode 133 \(result %\d+\) is not evaluated"):
        workgroup_memory_bytes(struct.pack(f"<{len(words)}I", *words))


def test_pipeline_refuses_shared_memory_over_the_limit():
    """A q8ta_gemm tiling over the device's shared memory is refused before the driver sees it,
    with the figures; the same variant within the limit builds."""
    device = get_device()
    limit = device.caps.limits.max_compute_shared_memory_size
    variant = catalog().variant("q8ta_gemm_fallback")
    block_k = 8
    while workgroup_memory_bytes(variant.spirv(), spec_values(variant, {"BLOCK_K": block_k})) <= limit:
        block_k *= 2
    need = workgroup_memory_bytes(variant.spirv(), spec_values(variant, {"BLOCK_K": block_k}))
    message = (f"variant q8ta_gemm_fallback with IN_LAYOUT=0, OUT_LAYOUT=1, TILE_M=4, TILE_N4=1, "
               f"THREADS_N=16, SPLIT_K=1, BLOCK_K={block_k}, RESIDUAL=0, HAS_LUT=0: {need} bytes of shared memory, "
               f"over the device limit of {limit}")
    with pytest.raises(UnsupportedVariant, match=re.escape(message)):
        device.pipelines.get(variant, {"BLOCK_K": block_k})
    assert device.pipelines.get(variant, {"BLOCK_K": block_k // 2}).handle
