"""layer_gaps.py: which messages of a layer older than VK_KHR_cooperative_matrix are dropped.

Pure Python on message texts and SPIR-V bytes (the generated binaries); the
device side (the cooperative-matrix shaders running under that layer with no
other message) is tests/ops/test_conv2d_coop.py on a device that has them.
"""

from __future__ import annotations

import struct

import pytest

from runtime.ops.library import catalog
from runtime.vulkan.layer_gaps import LayerGaps, declares_cooperative_matrix

# The 1.3.239 layer's text for an unknown struct (as reported for another extension in
# KhronosGroup/Vulkan-ValidationLayers issue 2755), with the cooperative-matrix sType.
UNKNOWN = ("Validation Error: [ VUID-VkDeviceCreateInfo-pNext-pNext ] Object 0: VK_NULL_HANDLE, "
           "type = VK_OBJECT_TYPE_DEVICE; | MessageID = 0x901f59ec | vkCreateDevice: "
           "pCreateInfo->pNext chain includes a structure with unknown VkStructureType ({})")
FEATURES2 = UNKNOWN.replace("VkDeviceCreateInfo", "VkPhysicalDeviceFeatures2")
MODULE = ("Validation Error: [ VUID-VkShaderModuleCreateInfo-pCode-01090 ] | vkCreateShaderModule(): "
          "A SPIR-V Capability (Unhandled OpCapability) was declared that is not supported by Vulkan.")
INVALID = "Validation Error: [ UNASSIGNED-CoreValidation-Shader-InconsistentSpirv ] SPIR-V module not valid: x"
# What the 1.3.239 layer said on an H100 when creating q8ta_gemm_coop's pipelines (abridged).
STAGE = ("Validation Error: [ VUID-VkPipelineShaderStageCreateInfo-module-parameter ] Object 0: "
         "handle = 0x30a9e260, type = VK_OBJECT_TYPE_DEVICE; | MessageID = 0xfd71dc70 | VkShaderModule "
         "0xf000000000f0[] does not contain valid spirv for stage VK_SHADER_STAGE_COMPUTE_BIT. Invalid "
         "capability operand: {}")
SPEC = ("Validation Error: [ VUID-VkPipelineShaderStageCreateInfo-pSpecializationInfo-06719 ] Object 0: "
        "handle = 0x3e1eee20 | VkShaderModule 0x4210000000421[] module (stage VK_SHADER_STAGE_COMPUTE_BIT) "
        "attempted to apply specialization constants with spirv-opt but failed.")
OTHER = "Validation Error: [ VUID-vkCmdDispatch-None-02697 ] descriptor set not bound"


def _spirv(variant: str) -> bytes:
    return catalog().variant(variant).spirv()


def test_declares_cooperative_matrix():
    assert declares_cooperative_matrix(_spirv("q8ta_gemm_coop_k64_w4"))
    assert not declares_cooperative_matrix(_spirv("q8ta_gemm_fallback"))
    assert not declares_cooperative_matrix(struct.pack("<5I", 0x07230203, 0x10000, 0, 1, 0))


def test_unknown_feature_struct_is_dropped_for_any_layer():
    gaps = LayerGaps()
    for layer in (None, (1, 3, 239), (1, 4, 300)):
        gaps.layer_version = layer
        assert gaps.tolerated(UNKNOWN.format(1000506000))
        assert gaps.tolerated(FEATURES2.format(1000506000))
        assert not gaps.tolerated(UNKNOWN.format(1000254000))  # another extension's struct
        assert not gaps.tolerated(OTHER)


@pytest.mark.parametrize(("layer", "coop", "dropped"), [
    ((1, 3, 239), True, True),
    ((1, 3, 255), True, False),   # a layer that knows the extension: its shader messages count
    ((1, 3, 239), False, False),  # a module without cooperative matrices
    (None, True, False),
])
def test_shader_messages_are_dropped_only_inside_a_coop_module(layer, coop, dropped):
    gaps = LayerGaps()
    gaps.layer_version = layer
    spirv = _spirv("q8ta_gemm_coop_k64_w4" if coop else "q8ta_gemm_fallback")
    with gaps.coop_module(spirv):
        assert gaps.tolerated(MODULE) == dropped
        assert gaps.tolerated(INVALID) == dropped
        assert gaps.tolerated(STAGE.format(6022)) == dropped and gaps.tolerated(SPEC) == dropped
        assert not gaps.tolerated(STAGE.format(5345))  # another capability the layer lacks
        assert not gaps.tolerated(OTHER)
    assert not gaps.tolerated(MODULE) and not gaps.tolerated(SPEC)
