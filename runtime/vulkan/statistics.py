"""What the driver's compiler reports about a pipeline (VK_KHR_pipeline_executable_properties).

`pipeline_statistics()` builds a throwaway pipeline of a variant with
VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR (outside the pipeline cache, so
the compiler runs), reads each executable's statistics (which ones is the
driver's choice: registers, instructions, shared memory, spills...) and
destroys it. A tool for tuning kernels by occupancy: it must not record
commands or keep pipelines. Called by `runtime.tools.statistics_command`.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import UnsupportedVariant
from runtime.vulkan import raw
from runtime.vulkan.interface import Kernel
from runtime.vulkan.pipeline import Pipeline, spec_values

_VALUE_FIELDS = {0: "b32", 1: "i64", 2: "u64", 3: "f64"}  # VkPipelineExecutableStatisticFormatKHR


@dataclass(frozen=True)
class Statistic:
    """One statistic of one executable of a pipeline."""

    executable: str  # e.g. "Compute Shader" (the driver's name)
    name: str
    description: str
    value: bool | int | float


def pipeline_statistics(device, variant: Kernel, spec_constants: dict | None = None) -> list[Statistic]:
    """The compiler's statistics of `variant` specialized with `spec_constants`.

    Raises:
        UnsupportedVariant: the device cannot report them (caps.pipeline_statistics:
            VK_KHR_pipeline_executable_properties), or `spec_constants` names one
            the variant lacks.
        VulkanError: pipeline creation or a query failed.
    """
    if not device.caps.pipeline_statistics:
        raise UnsupportedVariant(f"device {device.caps.name} cannot report pipeline statistics: "
                                 "the driver lacks VK_KHR_pipeline_executable_properties")
    vk, ffi, lib = raw.load()
    handle = device.handle

    def entry(name: str):
        address = lib.vkGetDeviceProcAddr(handle, name.encode())
        if address == ffi.NULL:
            raise UnsupportedVariant(f"device {device.caps.name} has no entry point {name}")
        return ffi.cast(f"PFN_{name}", address)

    executables_of = entry("vkGetPipelineExecutablePropertiesKHR")
    statistics_of = entry("vkGetPipelineExecutableStatisticsKHR")
    pipeline = Pipeline(device, variant, variant.spirv(), spec_values(variant, spec_constants), ffi.NULL,
                        flags=vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR)
    try:
        info = ffi.new("VkPipelineInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR,
                                              "pipeline": pipeline.handle})
        executables = raw.enumerate_items(
            "VkPipelineExecutablePropertiesKHR", executables_of, handle, info,
            stype=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR)
        found = []
        for index, executable in enumerate(executables):
            which = ffi.new("VkPipelineExecutableInfoKHR*", {
                "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                "pipeline": pipeline.handle, "executableIndex": index})
            for item in raw.enumerate_items("VkPipelineExecutableStatisticKHR", statistics_of, handle,
                                            which, stype=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR):
                value = getattr(item.value, _VALUE_FIELDS[item.format])
                found.append(Statistic(raw.text(executable.name), raw.text(item.name),
                                       raw.text(item.description),
                                       bool(value) if item.format == 0 else value))
        return found
    finally:
        pipeline.destroy()

