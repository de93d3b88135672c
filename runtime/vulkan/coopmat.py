"""Cooperative-matrix shapes (VK_KHR_cooperative_matrix): the query and the capabilities.

`query_shapes()` calls vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR
(count, then an array of VkCooperativeMatrixPropertiesKHR with sType set) and
returns the device's `CoopMatrixShape`s. `COOPMAT_CAPABILITIES` names the
shapes shaders may require (with the subgroup size they assume); `coopmat_gap`
says why a device lacks one. Must not decide anything else about devices.
Called by probe.py (the query) and device.py (`Capabilities.supports`).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.vulkan import raw

# VkComponentTypeKHR -> short name (VK_COMPONENT_TYPE_*_KHR)
COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64",
                   7: "u8", 8: "u16", 9: "u32", 10: "u64"}
# VkScopeKHR -> short name
SCOPES = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue_family"}


@dataclass(frozen=True)
class CoopMatrixShape:
    """One VkCooperativeMatrixPropertiesKHR: Result = A (M x K) x B (K x N) + C (M x N)."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str
    scope: str
    saturating: bool = False

    def __str__(self) -> str:
        sat = ", saturating" if self.saturating else ""
        return (f"{self.m}x{self.n}x{self.k} {self.a} x {self.b} + {self.c} -> {self.result} "
                f"({self.scope}{sat})")


# capability name -> (the shape a shader multiplies with, the subgroup size it assumes)
COOPMAT_CAPABILITIES = {
    "coopmat_s8_16x16x32_sg32": (
        CoopMatrixShape(16, 16, 32, "s8", "s8", "s32", "s32", "subgroup"), 32),
    "coopmat_s8_16x8x32_sg32": (
        CoopMatrixShape(16, 8, 32, "s8", "s8", "s32", "s32", "subgroup"), 32),
}
MIN_API = (1, 3)  # the shaders are SPIR-V 1.6 (glslangValidator --target-env vulkan1.3)


def coopmat_gap(name: str, features, shapes, subgroup_size: int, size_range: tuple,
                api: tuple) -> str:
    """Why a device lacks capability `name` of `COOPMAT_CAPABILITIES`, or "" if it has it.

    Args:
        features: the device's enabled capability names (needs "cooperative_matrix").
        shapes: its `CoopMatrixShape`s.
        subgroup_size: its subgroup size.
        size_range: (min, max) subgroup size of its pipelines (SPIR-V 1.6 shaders may get any),
            or () if unknown.
        api: its Vulkan (major, minor).
    """
    shape, subgroup = COOPMAT_CAPABILITIES[name]
    if "cooperative_matrix" not in features:
        return "cooperative_matrix is not enabled"
    if tuple(api) < MIN_API:
        return f"Vulkan {api[0]}.{api[1]} < {MIN_API[0]}.{MIN_API[1]}"
    if shape not in shapes:
        return f"no cooperative matrix {shape}"
    if subgroup_size != subgroup:
        return f"subgroup size {subgroup_size}, not {subgroup}"
    if tuple(size_range) != (subgroup, subgroup):
        shown = "-".join(map(str, size_range)) or "unknown"
        return f"subgroup sizes {shown} may vary, the shader needs {subgroup}"
    return ""


def query_shapes(instance, physical) -> tuple[CoopMatrixShape, ...]:
    """The cooperative-matrix shapes `physical` reports, sorted (empty if the call is missing)."""
    vk, ffi, lib = raw.load()
    address = lib.vkGetInstanceProcAddr(instance, b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    if address == ffi.NULL:
        return ()
    query = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", address)
    items = raw.enumerate_items("VkCooperativeMatrixPropertiesKHR", query, physical,
                                stype=vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR)
    return tuple(sorted({_shape(item) for item in items}, key=str))


def _shape(p) -> CoopMatrixShape:
    def kind(value):
        return COMPONENT_TYPES.get(value, f"type{value}")

    return CoopMatrixShape(p.MSize, p.NSize, p.KSize, kind(p.AType), kind(p.BType), kind(p.CType),
                           kind(p.ResultType), SCOPES.get(p.scope, f"scope{p.scope}"),
                           bool(p.saturatingAccumulation))
