"""Validation messages a Khronos layer older than VK_KHR_cooperative_matrix emits about it.

The layer Debian ships (1.3.239) predates VK_KHR_cooperative_matrix (header
1.3.255). Rather than switch the feature off under validation (which would
leave the cooperative-matrix shaders untested there), the device chains the
feature struct and `LayerGaps` drops exactly the messages that only say the
layer does not know the extension:

1. ``VUID-VkPhysicalDeviceFeatures2-pNext-pNext`` and
   ``VUID-VkDeviceCreateInfo-pNext-pNext`` naming the "unknown VkStructureType
   (1000506000)", VkPhysicalDeviceCooperativeMatrixFeaturesKHR: a layer that
   knows the struct never says it, so this rule holds for every layer;
2. while `coop_module()` is creating the shader module and pipeline of SPIR-V
   that declares the CooperativeMatrixKHR capability, and only under a layer
   older than 1.3.255: the shader-module messages (VUIDs
   ``VkShaderModuleCreateInfo-pCode-*`` and "SPIR-V module not valid", and the
   two the 1.3.239 layer was seen to emit on an H100:
   ``VkPipelineShaderStageCreateInfo-module-parameter`` "Invalid capability
   operand: 6022" and ``-pSpecializationInfo-06719`` "attempted to apply
   specialization constants with spirv-opt but failed"), which come from the
   layer's SPIR-V tables and validator, older than SPV_KHR_cooperative_matrix. Those modules were checked by a current
   spirv-val when they were built (codegen/glslc.py).

Any other message stays an error. Must not know about ops or variants.
Used by device.py (the messenger's messages) and pipeline.py (`coop_module`).
"""

from __future__ import annotations

import re
import struct
from contextlib import contextmanager

COOPMAT_FEATURES_STYPE = 1000506000  # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR
COOPMAT_HEADER = (1, 3, 255)  # the first Vulkan header with VK_KHR_cooperative_matrix
CAPABILITY_COOPERATIVE_MATRIX_KHR = 6022
OP_CAPABILITY = 17

_UNKNOWN_STRUCT = re.compile(
    r"VUID-Vk(?:PhysicalDeviceFeatures2|DeviceCreateInfo)-pNext-pNext\b.*"
    rf"unknown VkStructureType \({COOPMAT_FEATURES_STYPE}\)", re.DOTALL)
_SHADER_MODULE = re.compile(
    r"VUID-VkShaderModuleCreateInfo-pCode-\d+|SPIR-V module not valid"
    rf"|VUID-VkPipelineShaderStageCreateInfo-module-parameter\b.*Invalid capability operand: "
    rf"{CAPABILITY_COOPERATIVE_MATRIX_KHR}\b"
    r"|VUID-VkPipelineShaderStageCreateInfo-pSpecializationInfo-06719\b.*"
    r"apply specialization constants with spirv-opt but failed", re.DOTALL)


def declares_cooperative_matrix(spirv: bytes) -> bool:
    """Whether a SPIR-V module declares the CooperativeMatrixKHR capability.

    Capabilities are the module's first instructions, after the 5-word header.
    """
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv[: len(spirv) // 4 * 4])
    at = 5
    while at < len(words) and words[at] & 0xFFFF == OP_CAPABILITY and words[at] >> 16 == 2:
        if words[at + 1] == CAPABILITY_COOPERATIVE_MATRIX_KHR:
            return True
        at += 2
    return False


class LayerGaps:
    """Decides which validation messages are the layer's gaps (see the module doc)."""

    def __init__(self):
        self.layer_version: tuple | None = None  # set once the instance reports it
        self._in_coop_module = False

    def tolerated(self, text: str) -> bool:
        """Whether a message only says the layer does not know cooperative matrices."""
        if _UNKNOWN_STRUCT.search(text):
            return True
        old = self.layer_version is not None and tuple(self.layer_version) < COOPMAT_HEADER
        return old and self._in_coop_module and bool(_SHADER_MODULE.search(text))

    @contextmanager
    def coop_module(self, spirv: bytes):
        """Tolerate rule 2's messages while the module of `spirv` (if it uses cooperative
        matrices) and its pipeline are created."""
        previous = self._in_coop_module
        self._in_coop_module = declares_cooperative_matrix(spirv)
        try:
            yield
        finally:
            self._in_coop_module = previous
