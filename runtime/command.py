"""Streams: record dispatches into one command buffer, submit, wait, replay.

A `Stream` turns stub calls into Vulkan commands: it uploads inputs, makes
outputs, writes descriptor sets, packs push constants by the manifest's
offsets, converts global sizes to group counts (folding an over-long 1-D
dispatch into x*y), brackets every dispatch with timestamps and barriers, and
submits with a fence. The command buffer starts with a barrier from all
earlier host/transfer/compute writes to compute, puts a compute->compute
barrier between dispatches and ends with compute writes -> host/transfer
reads. Recording and submission use pre-built cffi structs and raw `lib`
calls. It must not choose variants or check op arguments (the stubs do).
Called by the op stubs, the registry and tests.
"""

from __future__ import annotations

import json
import os
import struct

from runtime import _vk
from runtime.errors import DispatchError, VulkanError
from runtime.tensor import Tensor, dtype_info

PUSH_FORMATS = {"uint": "I", "int": "i", "float": "f", "uvec4": "4I", "ivec4": "4i", "vec4": "4f"}
POOL_SETS = 128
QUERIES_PER_POOL = 128
OUT_OF_POOL = (-1000069000, -12)  # VK_ERROR_OUT_OF_POOL_MEMORY, VK_ERROR_FRAGMENTED_POOL


def group_counts(workgroup, global_size=None, groups=None) -> tuple[list[int], list[int]]:
    """Group counts and global size (each 3 long) from exactly one of `global_size` / `groups`.

    Raises:
        DispatchError: neither or both given, or more than 3 dimensions.
    """
    if (global_size is None) == (groups is None):
        raise DispatchError("dispatch needs exactly one of global_size= and groups=")
    size = [int(v) for v in (global_size if groups is None else groups)]
    if not 1 <= len(size) <= 3:
        raise DispatchError(f"dispatch size must have 1 to 3 dimensions, got {size}")
    size += [1] * (3 - len(size))
    if groups is not None:
        return size, [g * w for g, w in zip(size, workgroup, strict=True)]
    return [-(-g // w) for g, w in zip(size, workgroup, strict=True)], size


def fold_groups(counts: list[int], limits) -> list[int]:
    """Fold an x count over `limits[0]` into x*y when y == z == 1.

    Raises:
        DispatchError: a count is still over its limit.
    """
    x, y, z = counts
    if x > limits[0] and y == z == 1:
        x, y = limits[0], -(-x // limits[0])
    if x > limits[0] or y > limits[1] or z > limits[2]:
        raise DispatchError(f"group counts {list(counts)} exceed the device limit {list(limits)}")
    return [x, y, z]


def pack_push(variant, op: str, push: dict) -> bytes:
    """Pack `push` (field name -> value) by the manifest's field offsets and types.

    Raises:
        DispatchError: missing or unknown field names, or a value that does not fit its type.
    """
    fields = variant.interface.push_constants
    _check_names(op, variant, "push constants", {f.name for f in fields}, push)
    data = bytearray(variant.interface.push_constants_size)
    for field in fields:
        value = push[field.name]
        values = list(value) if field.type.endswith("vec4") else [value]
        try:
            struct.pack_into("<" + PUSH_FORMATS[field.type], data, field.offset, *values)
        except struct.error as exc:
            raise DispatchError(f"{op}: variant {variant.name}: push constant '{field.name}' "
                                f"({field.type}) cannot hold {value!r}: {exc}") from None
    return bytes(data)


def _check_names(op: str, variant, what: str, expected: set, given: dict) -> None:
    missing, extra = sorted(expected - set(given)), sorted(set(given) - expected)
    if missing or extra:
        raise DispatchError(f"{op}: variant {variant.name}: {what} missing {missing}, "
                            f"unexpected {extra}; expected {sorted(expected)}")


def _destroy_stream(lib, null, device, pool, command_buffers, fence, descriptor_pools, query_pools):
    for query_pool in query_pools:
        lib.vkDestroyQueryPool(device, query_pool, null)
    for descriptor_pool in descriptor_pools:
        lib.vkDestroyDescriptorPool(device, descriptor_pool, null)
    lib.vkDestroyFence(device, fence, null)
    lib.vkFreeCommandBuffers(device, pool, 1, command_buffers)


class Stream:
    """Records dispatches into one command buffer; `run()` submits and waits.

    Args:
        device: the `Device`; default `get_device()`.
        library: the `ShaderLibrary` variants come from; default `get_library()`.
    """

    def __init__(self, device=None, library=None):
        vk, ffi, lib = _vk.load()
        if device is None:
            from runtime.device import get_device

            device = get_device()
        self.device, self._library, self._vk, self._ffi, self._lib = device, library, vk, ffi, lib
        self._command_buffers = ffi.new("VkCommandBuffer[]", 1)
        alloc = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": device.command_pool, "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            "commandBufferCount": 1})
        _vk.check(lib.vkAllocateCommandBuffers(device.handle, alloc, self._command_buffers),
                  "vkAllocateCommandBuffers")
        self._cb = self._command_buffers[0]
        self._fence = device.create_fence()
        self._fences = ffi.new("VkFence[]", [self._fence])
        self._descriptor_pools, self._query_pools = [], []
        self._finalizer = device.track(
            self, _destroy_stream, lib, ffi.NULL, device.handle, device.command_pool,
            self._command_buffers, self._fence, self._descriptor_pools, self._query_pools)
        self._submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self._command_buffers})
        self._begin_info = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        self._set_alloc = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorSetCount": 1})
        self._set_layouts = ffi.new("VkDescriptorSetLayout[]", 1)
        self._set = ffi.new("VkDescriptorSet[]", 1)
        compute, shader = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        shader_rw = vk.VK_ACCESS_SHADER_READ_BIT | shader
        self._begin_barrier = _vk.Barrier(
            vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT | compute,
            vk.VK_ACCESS_HOST_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | shader, compute, shader_rw)
        self._between_barrier = _vk.Barrier(compute, shader, compute, shader_rw)
        self._end_barrier = _vk.Barrier(
            compute, shader, vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)
        self._timestamps = device.caps.timestamps
        self._dummies: dict[tuple, Tensor] = {}
        self._state = "empty"  # -> "recording" -> "ready" (recorded, ended)
        self._reset_recording()

    # -- tensors --------------------------------------------------------------------

    def upload(self, value, binding, label: str | None = None) -> Tensor:
        """A device tensor for `binding` (a `BindingInfo`) holding `value`.

        Args:
            value: a torch tensor (converted to the binding's dtype) or a device
                `Tensor` of the binding's dtype and storage (used as is).
            binding: where the tensor will be bound.
            label: what it is, for errors (e.g. "etvk.x.default: argument 'input'").

        Raises:
            DispatchError: a device tensor of another dtype or storage.
            TensorTooLarge: over the device's limits for the binding's storage.
        """
        label = label or f"binding '{binding.name}'"
        dtype = dtype_info(binding.dtype, label).torch_dtype
        if isinstance(value, Tensor):
            if value.dtype != dtype or value.storage != binding.storage:
                raise DispatchError(f"{label}: device tensor is {value.dtype} {value.storage}, "
                                    f"binding '{binding.name}' needs {dtype} {binding.storage}")
            return value
        return Tensor.from_torch(value, binding.storage, dtype, label, self.device)

    def empty(self, shape, dtype, binding, label: str | None = None) -> Tensor:
        """A zero-filled device tensor of `shape` for `binding`.

        Raises:
            DispatchError: `dtype` is not the binding's dtype (a spec bug).
            TensorTooLarge: over the device's limits for the binding's storage.
        """
        label = label or f"binding '{binding.name}'"
        if dtype_info(dtype, label).name != binding.dtype:
            raise DispatchError(f"{label}: dtype {dtype} differs from binding '{binding.name}' "
                                f"dtype {binding.dtype} (a spec bug)")
        return Tensor.empty(shape, dtype, binding.storage, label, self.device)

    # -- recording ------------------------------------------------------------------

    def dispatch(self, variant, op: str, *, bindings: dict, push: dict, global_size=None,
                 groups=None, spec_constants: dict | None = None) -> None:
        """Record one dispatch of `variant` for op `op`.

        Args:
            variant: a variant name or an object with `.name` (e.g. `VariantInfo`).
            op: the op name, for errors and the dispatch trace.
            bindings: binding name -> device `Tensor` (None or empty binds a dummy).
            push: push-constant name -> value (int/float, or 4 numbers for vec4 types).
            global_size: invocations per dimension (1 to 3 numbers), or
            groups: workgroups per dimension; exactly one of the two.
            spec_constants: spec-constant name -> value, overriding defaults.

        Raises:
            DispatchError: names or sizes that do not match the variant.
            UnsupportedVariant: the variant exceeds a device limit.
        """
        self.device.require_open()
        library = self._library_()
        info = library.variant(variant if isinstance(variant, str) else variant.name)
        _check_names(op, info, "bindings", {b.name for b in info.interface.bindings}, bindings)
        push_data = pack_push(info, op, push)
        counts, global_size = group_counts(info.interface.workgroup, global_size, groups)
        if 0 in counts:
            return
        counts = fold_groups(counts, self.device.caps.limits.max_compute_work_group_count)
        pipeline = self.device.pipelines.get(library, info, spec_constants)
        if self._state == "ready":  # a new recording after run()
            self._restart()
        descriptor_set = self._write_descriptors(pipeline, info, bindings)
        lib, cb = self._lib, self._cb
        if self._state == "empty":
            _vk.check(lib.vkBeginCommandBuffer(cb, self._begin_info), "vkBeginCommandBuffer")
            self._begin_barrier.record(cb)
            self._state = "recording"
        else:
            self._between_barrier.record(cb)
        query = self._next_queries(info.name)
        compute = self._vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        if query:
            lib.vkCmdWriteTimestamp(cb, compute, query[0], query[1])
        lib.vkCmdBindPipeline(cb, self._vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
        self._set[0] = descriptor_set
        lib.vkCmdBindDescriptorSets(cb, self._vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                    0, 1, self._set, 0, self._ffi.NULL)
        if push_data:
            lib.vkCmdPushConstants(cb, pipeline.layout, self._vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                   len(push_data), self._ffi.from_buffer(push_data))
        lib.vkCmdDispatch(cb, *counts)
        if query:
            lib.vkCmdWriteTimestamp(cb, compute, query[0], query[1] + 1)
        self._keepalive.append(bindings)
        trace = os.environ.get("ETVK_TRACE_DISPATCH")
        if trace:
            with open(trace, "a") as f:
                f.write(json.dumps({"op": op, "variant": info.name, "global": global_size,
                                    "local": list(info.interface.workgroup), "groups": counts,
                                    "device": self.device.caps.name}) + "\n")

    def _library_(self):
        if self._library is None:
            from runtime.shaders import get_library

            self._library = get_library()
        return self._library

    def _write_descriptors(self, pipeline, info, bindings: dict):
        vk, ffi, lib = self._vk, self._ffi, self._lib
        self._set_layouts[0] = pipeline.set_layout
        self._set_alloc.pSetLayouts = self._set_layouts
        result = OUT_OF_POOL[0]
        while result in OUT_OF_POOL:
            if self._pool_index == len(self._descriptor_pools):
                self._new_descriptor_pool()
            self._set_alloc.descriptorPool = self._descriptor_pools[self._pool_index]
            result = lib.vkAllocateDescriptorSets(self.device.handle, self._set_alloc, self._set)
            if result in OUT_OF_POOL:
                self._pool_index += 1
        _vk.check(result, "vkAllocateDescriptorSets")
        descriptor_set = self._set[0]
        count = len(info.interface.bindings)
        buffer_infos = ffi.new("VkDescriptorBufferInfo[]", count)
        image_infos = ffi.new("VkDescriptorImageInfo[]", count)
        writes = ffi.new("VkWriteDescriptorSet[]", count)
        for i, binding in enumerate(info.interface.bindings):
            memory = self._memory_for(binding, bindings[binding.name])
            write = writes[i]
            write.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
            write.dstSet, write.dstBinding, write.descriptorCount = descriptor_set, binding.binding, 1
            if binding.storage == "texture3d":
                image_infos[i].imageView = memory.view
                image_infos[i].imageLayout = vk.VK_IMAGE_LAYOUT_GENERAL
                write.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE
                write.pImageInfo = image_infos + i
            else:
                buffer_infos[i].buffer, buffer_infos[i].range = memory.handle, memory.nbytes
                write.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                write.pBufferInfo = buffer_infos + i
        lib.vkUpdateDescriptorSets(self.device.handle, count, writes, 0, ffi.NULL)
        return descriptor_set

    def _memory_for(self, binding, tensor):
        if tensor is not None and tensor.memory is not None:
            if tensor.device is not self.device:
                raise DispatchError(f"binding '{binding.name}': {tensor!r} lives on another device")
            if tensor.storage != binding.storage or tensor.dtype != dtype_info(binding.dtype).torch_dtype:
                raise DispatchError(f"binding '{binding.name}' needs {binding.dtype} {binding.storage}, "
                                    f"got {tensor!r}")
            return tensor.memory
        key = (binding.storage, binding.dtype)
        if key not in self._dummies:
            self._dummies[key] = Tensor.empty([4], dtype_info(binding.dtype).torch_dtype,
                                              binding.storage, "dummy binding", self.device)
        return self._dummies[key].memory

    def _new_descriptor_pool(self):
        vk, ffi, lib = self._vk, self._ffi, self._lib
        sizes = ffi.new("VkDescriptorPoolSize[]", [
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "descriptorCount": 8 * POOL_SETS},
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE, "descriptorCount": 8 * POOL_SETS}])
        info = ffi.new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, "maxSets": POOL_SETS,
            "poolSizeCount": 2, "pPoolSizes": sizes})
        pool = ffi.new("VkDescriptorPool*")
        _vk.check(lib.vkCreateDescriptorPool(self.device.handle, info, ffi.NULL, pool),
                  "vkCreateDescriptorPool")
        self._descriptor_pools.append(pool[0])

    def _next_queries(self, label: str):
        """Reserve two timestamp queries for one dispatch: (pool, first index), or None."""
        if not self._timestamps:
            return None
        used = len(self._timed) * 2
        if used // QUERIES_PER_POOL >= len(self._query_pools):
            vk, ffi, lib = self._vk, self._ffi, self._lib
            info = ffi.new("VkQueryPoolCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                "queryType": vk.VK_QUERY_TYPE_TIMESTAMP, "queryCount": QUERIES_PER_POOL})
            pool = ffi.new("VkQueryPool*")
            _vk.check(lib.vkCreateQueryPool(self.device.handle, info, ffi.NULL, pool),
                      "vkCreateQueryPool")
            self._query_pools.append(pool[0])
        pool = self._query_pools[used // QUERIES_PER_POOL]
        if used % QUERIES_PER_POOL == 0:
            self._lib.vkCmdResetQueryPool(self._cb, pool, 0, QUERIES_PER_POOL)
        query = (pool, used % QUERIES_PER_POOL)
        self._timed.append((label, *query))
        return query

    def _reset_recording(self) -> None:
        self._keepalive: list = []
        self._timed: list[tuple] = []
        self._pool_index = 0

    def _restart(self) -> None:
        _vk.check(self._lib.vkResetCommandBuffer(self._cb, 0), "vkResetCommandBuffer")
        for pool in self._descriptor_pools:
            _vk.check(self._lib.vkResetDescriptorPool(self.device.handle, pool, 0),
                      "vkResetDescriptorPool")
        self._reset_recording()
        self._state = "empty"

    # -- submission -----------------------------------------------------------------

    def run(self) -> None:
        """Finish recording, submit and wait. A stream with no dispatches does nothing.

        Raises:
            VulkanError: submission or wait failed.
        """
        if self._state == "recording":
            self._end_barrier.record(self._cb)
            _vk.check(self._lib.vkEndCommandBuffer(self._cb), "vkEndCommandBuffer")
            self._state = "ready"
        if self._state == "ready":
            self._submit_and_wait()

    def replay(self) -> None:
        """Submit the recorded command buffer again and wait.

        Raises:
            DispatchError: nothing was recorded and run yet.
        """
        if self._state != "ready":
            raise DispatchError("replay() needs a stream that was recorded and run()")
        self._submit_and_wait()

    def _submit_and_wait(self) -> None:
        self.device.require_open()
        lib, handle = self._lib, self.device.handle
        _vk.check(lib.vkQueueSubmit(self.device.queue, 1, self._submit, self._fence), "vkQueueSubmit")
        _vk.check(lib.vkWaitForFences(handle, 1, self._fences, 1, 2**64 - 1), "vkWaitForFences")
        _vk.check(lib.vkResetFences(handle, 1, self._fences), "vkResetFences")

    def timings(self) -> list[tuple[str, float]]:
        """`[(variant name, seconds)]` of every dispatch of the last run, from timestamps.

        Returns:
            An empty list when the queue has no timestamps or nothing ran.
        """
        if self._state != "ready":
            return []
        ffi, lib = self._ffi, self._lib
        mask = (1 << self.device.timestamp_valid_bits) - 1 if self.device.timestamp_valid_bits < 64 else -1
        period = self.device.caps.timestamp_period * 1e-9
        stamps = ffi.new("uint64_t[2]")
        flags = self._vk.VK_QUERY_RESULT_64_BIT | self._vk.VK_QUERY_RESULT_WAIT_BIT
        result = []
        for label, pool, index in self._timed:
            status = lib.vkGetQueryPoolResults(self.device.handle, pool, index, 2, 16, stamps, 8, flags)
            if status != 0:
                raise VulkanError(status, "vkGetQueryPoolResults")
            result.append((label, ((stamps[1] - stamps[0]) & mask) * period))
        return result

    def close(self) -> None:
        """Free the command buffer, fence, pools and dummies (tensors stay valid)."""
        self._finalizer()
        self._dummies.clear()
        self._reset_recording()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
