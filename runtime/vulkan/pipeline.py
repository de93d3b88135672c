"""Compute pipelines for kernels (shader variants), cached in memory and on disk.

A `Pipeline` is a shader module, a descriptor-set layout (STORAGE_BUFFER for
buffer bindings, STORAGE_IMAGE for image ones), a pipeline layout with the
kernel's push-constant range, and the compute pipeline specialised with the
workgroup size (ids 0, 1, 2) and the kernel's spec constants (ids 3+),
refused before it reaches the driver when it is over a device limit
(workgroup size, push constants, shared memory: workgroup_memory.py).
`PipelineCache` keeps one per (kernel, spec constants) and a VkPipelineCache
persisted under `<cache>/pipelines/` (`cache_dir()`), keyed by vendor,
device, driver version and pipelineCacheUUID. It must not record commands,
allocate tensors or know where kernels come from. Created by device.py;
`get()` is called by stream.py and by loaded programs (to build up front).
"""

from __future__ import annotations

import os
import struct
import warnings
from pathlib import Path

from runtime.errors import UnsupportedVariant
from runtime.vulkan import raw
from runtime.vulkan.interface import IMAGE_STORAGES, Kernel
from runtime.vulkan.workgroup_memory import SpirvError, workgroup_memory_bytes

SPEC_FORMATS = {"int": "i", "uint": "I", "float": "f", "bool": "I"}


def cache_dir() -> Path:
    """`ETVK_CACHE_DIR`, else `~/.cache/etvk`; pipeline caches go under `pipelines/`."""
    return Path(os.environ.get("ETVK_CACHE_DIR") or Path.home() / ".cache" / "etvk")


def spec_values(variant: Kernel, overrides: dict | None) -> tuple:
    """Resolve a variant's specialization constants in id order: workgroup (ids 0-2), then user ones.

    Args:
        variant: the variant.
        overrides: spec-constant name -> value; others keep their defaults.

    Returns:
        A tuple of (id, struct format, value).

    Raises:
        UnsupportedVariant: `overrides` names a spec constant the variant does not have.
    """
    overrides = dict(overrides or {})
    known = {s.name for s in variant.interface.spec_constants}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UnsupportedVariant(f"variant {variant.name} has no spec constant(s) {unknown}; "
                                 f"it has: {sorted(known) or 'none'}")
    values = [(i, "I", size) for i, size in enumerate(variant.interface.workgroup)]
    for spec in sorted(variant.interface.spec_constants, key=lambda s: s.id):
        value = overrides.get(spec.name, spec.default)
        values.append((spec.id, SPEC_FORMATS[spec.type], int(value) if spec.type == "bool" else value))
    return tuple(values)


def _check_limits(variant: Kernel, limits, spirv: bytes, specs: tuple) -> None:
    workgroup = variant.interface.workgroup
    size = workgroup[0] * workgroup[1] * workgroup[2]
    if size > limits.max_compute_work_group_invocations or any(
            w > m for w, m in zip(workgroup, limits.max_compute_work_group_size, strict=True)):
        raise UnsupportedVariant(
            f"variant {variant.name}: workgroup {list(workgroup)} is over the device limits "
            f"({list(limits.max_compute_work_group_size)}, {limits.max_compute_work_group_invocations} "
            "invocations)")
    if variant.interface.push_constants_size > limits.max_push_constants_size:
        raise UnsupportedVariant(
            f"variant {variant.name}: {variant.interface.push_constants_size} bytes of push "
            f"constants, over the device limit of {limits.max_push_constants_size}")
    try:
        shared = workgroup_memory_bytes(spirv, specs)
    except SpirvError:  # a construct the reader does not evaluate: the driver's own check decides
        return
    if shared > limits.max_compute_shared_memory_size:
        names = {s.id: s.name for s in variant.interface.spec_constants}
        given = ", ".join(f"{names[i]}={value}" for i, _, value in specs if i in names)
        raise UnsupportedVariant(
            f"variant {variant.name}{f' with {given}' if given else ''}: {shared} bytes of shared "
            f"memory, over the device limit of {limits.max_compute_shared_memory_size}")


class Pipeline:
    """One compute pipeline and the layouts it needs; destroyed by `PipelineCache.close()`
    (statistics.py creates its own with `flags` that capture statistics, and destroys it)."""

    def __init__(self, device, variant: Kernel, spirv: bytes, specs: tuple, vk_cache, flags: int = 0):
        _, ffi, _ = raw.load()
        _check_limits(variant, device.caps.limits, spirv, specs)
        self.device, self.variant = device, variant
        self.module = self.set_layout = self.layout = self.handle = ffi.NULL
        try:
            with device.layer_gaps.coop_module(spirv):
                self._create(device, variant, spirv, specs, vk_cache, flags)
        except BaseException:
            self.destroy()
            raise

    def _create(self, device, variant: Kernel, spirv: bytes, specs: tuple, vk_cache, flags) -> None:
        """Create the module, layouts and pipeline; `__init__` destroys them on failure."""
        vk, ffi, lib = raw.load()
        handle = device.handle
        code = ffi.from_buffer(spirv)
        module_info = ffi.new("VkShaderModuleCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, "codeSize": len(spirv),
            "pCode": ffi.cast("uint32_t*", code)})
        out = ffi.new("VkShaderModule*")
        raw.check(lib.vkCreateShaderModule(handle, module_info, ffi.NULL, out),
                  f"vkCreateShaderModule ({variant.name})")
        self.module = out[0]

        bindings = variant.interface.bindings
        layout_bindings = ffi.new("VkDescriptorSetLayoutBinding[]", [{
            "binding": b.binding, "descriptorCount": 1,
            "descriptorType": vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE if b.storage in IMAGE_STORAGES
            else vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
            "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT} for b in bindings])
        set_info = ffi.new("VkDescriptorSetLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
            "bindingCount": len(bindings), "pBindings": layout_bindings})
        out = ffi.new("VkDescriptorSetLayout*")
        raw.check(lib.vkCreateDescriptorSetLayout(handle, set_info, ffi.NULL, out),
                  f"vkCreateDescriptorSetLayout ({variant.name})")
        self.set_layout = out[0]

        push_size = variant.interface.push_constants_size
        push_range = ffi.new("VkPushConstantRange*", {
            "stageFlags": vk.VK_SHADER_STAGE_COMPUTE_BIT, "offset": 0, "size": push_size})
        set_layouts = ffi.new("VkDescriptorSetLayout[]", [self.set_layout])
        layout_info = ffi.new("VkPipelineLayoutCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, "setLayoutCount": 1,
            "pSetLayouts": set_layouts, "pushConstantRangeCount": 1 if push_size else 0,
            "pPushConstantRanges": push_range if push_size else ffi.NULL})
        out = ffi.new("VkPipelineLayout*")
        raw.check(lib.vkCreatePipelineLayout(handle, layout_info, ffi.NULL, out),
                  f"vkCreatePipelineLayout ({variant.name})")
        self.layout = out[0]

        data = b"".join(struct.pack("<" + fmt, value) for _, fmt, value in specs)
        spec_data = ffi.new("char[]", data)
        entries = ffi.new("VkSpecializationMapEntry[]", [
            {"constantID": cid, "offset": 4 * i, "size": 4} for i, (cid, _, _) in enumerate(specs)])
        spec_info = ffi.new("VkSpecializationInfo*", {
            "mapEntryCount": len(specs), "pMapEntries": entries, "dataSize": len(data),
            "pData": spec_data})
        entry_name = ffi.new("char[]", b"main")
        pipeline_info = ffi.new("VkComputePipelineCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, "flags": flags,
            "stage": {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                      "stage": vk.VK_SHADER_STAGE_COMPUTE_BIT, "module": self.module,
                      "pName": entry_name, "pSpecializationInfo": spec_info},
            "layout": self.layout, "basePipelineIndex": -1})
        out = ffi.new("VkPipeline*")
        raw.check(lib.vkCreateComputePipelines(handle, vk_cache, 1, pipeline_info, ffi.NULL, out),
                  f"vkCreateComputePipelines ({variant.name})")
        self.handle = out[0]

    def destroy(self) -> None:
        """Destroy the pipeline, its layouts and its shader module."""
        _, ffi, lib = raw.load()
        handle = self.device.handle
        lib.vkDestroyPipeline(handle, self.handle, ffi.NULL)
        lib.vkDestroyPipelineLayout(handle, self.layout, ffi.NULL)
        lib.vkDestroyDescriptorSetLayout(handle, self.set_layout, ffi.NULL)
        lib.vkDestroyShaderModule(handle, self.module, ffi.NULL)


class PipelineCache:
    """The device's pipelines, and its VkPipelineCache loaded from / saved to disk.

    Args:
        device: the `Device` (created by it at start, closed by it at close).
    """

    def __init__(self, device):
        vk, ffi, lib = raw.load()
        self.device = device
        self._pipelines: dict[tuple, Pipeline] = {}
        # (name, spirv key, workgroup) -> pipeline with default specs. The workgroup is part of
        # every key: a caller may run a variant with another one (dataclasses.replace of its
        # interface, as the quantize tunables do), and it is a specialization of the pipeline.
        self._defaults: dict[tuple, Pipeline] = {}
        # (name, spirv key, workgroup, spec-constant items as given) -> pipeline: skips
        # resolving them again
        self._given: dict[tuple, Pipeline] = {}
        caps = device.caps
        self.path = Path(cache_dir()) / "pipelines" / (
            f"{caps.vendor_id:04x}-{caps.device_id:04x}-{caps.driver_version:08x}-"
            f"{caps.pipeline_cache_uuid.hex()}.bin")
        try:
            initial = self.path.read_bytes()
        except OSError:
            initial = b""
        data = ffi.from_buffer(initial)
        info = ffi.new("VkPipelineCacheCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
            "initialDataSize": len(initial), "pInitialData": data if initial else ffi.NULL})
        out = ffi.new("VkPipelineCache*")
        raw.check(lib.vkCreatePipelineCache(device.handle, info, ffi.NULL, out), "vkCreatePipelineCache")
        self.handle = out[0]

    def get(self, variant: Kernel, spec_constants: dict | None = None) -> Pipeline:
        """Return the pipeline of `variant` with `spec_constants`, building it on first use.

        Raises:
            UnsupportedVariant: over a device limit, or an unknown spec constant.
            VulkanError: pipeline creation failed.
        """
        workgroup = variant.interface.workgroup
        if not spec_constants:  # the common case, without resolving the spec constants
            pipeline = self._defaults.get((variant.name, variant.spirv_key, workgroup))
            if pipeline is not None:
                return pipeline
        else:
            given = (variant.name, variant.spirv_key, workgroup, tuple(spec_constants.items()))
            try:
                pipeline = self._given.get(given)
            except TypeError:  # an unhashable value: resolved (and refused) below
                given = pipeline = None
            if pipeline is not None:
                return pipeline
        specs = spec_values(variant, spec_constants)
        key = (variant.name, variant.spirv_key, specs)
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            pipeline = Pipeline(self.device, variant, variant.spirv(), specs, self.handle)
            self._pipelines[key] = pipeline
        if not spec_constants:
            self._defaults[(variant.name, variant.spirv_key, workgroup)] = pipeline
        elif given is not None:
            self._given[given] = pipeline
        return pipeline

    def close(self) -> None:
        """Save the VkPipelineCache to disk, then destroy every pipeline and the cache."""
        _, ffi, lib = raw.load()
        handle = self.device.handle
        size = ffi.new("size_t*")
        if lib.vkGetPipelineCacheData(handle, self.handle, size, ffi.NULL) == 0 and size[0]:
            data = ffi.new("char[]", size[0])
            if lib.vkGetPipelineCacheData(handle, self.handle, size, data) == 0:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
                    temporary.write_bytes(ffi.buffer(data, size[0])[:])
                    temporary.replace(self.path)
                except OSError as exc:
                    warnings.warn(f"cannot save the pipeline cache to {self.path}: {exc}", stacklevel=2)
        for pipeline in reversed(list(self._pipelines.values())):
            pipeline.destroy()
        self._pipelines.clear()
        self._defaults.clear()
        self._given.clear()
        lib.vkDestroyPipelineCache(handle, self.handle, ffi.NULL)
