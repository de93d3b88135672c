"""Streams: record dispatches into one command buffer, submit, wait, replay.

A `Stream` turns stub calls into Vulkan commands: it uploads inputs, makes
outputs, writes descriptor sets, packs push constants by the manifest's
offsets and converts global sizes to group counts (both in dispatch.py),
brackets every dispatch with timestamps and barriers, and
submits with a fence (polled for up to the device's `fence_spin` seconds,
then waited for). The command buffer starts with a barrier from all
earlier host/transfer/compute writes to compute, puts a compute->compute
barrier before each dispatch that touches memory an earlier dispatch since
the last barrier wrote (or writes memory one read: the bindings' access in
the manifest says which), so that independent dispatches may overlap, and
ends with compute writes -> host/transfer reads. Recording and submission use pre-built cffi structs and raw `lib`
calls. `dispatch()` only checks and notes a dispatch; `finish()` takes a
command buffer with its fence, descriptor and query pools and structs
(`_Resources`) from the device's `recordings` (recordings.py) by the
signature of the noted dispatches (pipelines, bound allocations by serial
number, push constants, group counts) and writes the Vulkan commands only
when it did not get a recording of exactly those dispatches; `close()`
gives the resources back, still recorded. A fresh op call on the same
sizes then skips recording: the spare memory hands it the same
allocations. Omitted tensors bind one zero-filled dummy per device,
storage and dtype. It must not choose variants or check op arguments (the
stubs do) nor know where kernels come from (the op library). Called by the
op stubs, the registry, loaded programs and tests.
"""

from __future__ import annotations

import json
import os
import time
import weakref

from runtime.errors import DispatchError, VulkanError
from runtime.vulkan import raw
from runtime.vulkan.device import get_device
from runtime.vulkan.dispatch import check_names, fold_groups, group_counts, layout, pack_push
from runtime.vulkan.interface import IMAGE_STORAGES
from runtime.vulkan.tensor import Constant, Tensor, buffer_bytes, dtype_info

POOL_SETS = 128
QUERIES_PER_POOL = 128
OUT_OF_POOL = (-1000069000, -12)  # VK_ERROR_OUT_OF_POOL_MEMORY, VK_ERROR_FRAGMENTED_POOL
NOT_READY = 1  # VK_NOT_READY: vkGetFenceStatus of an unsignalled fence
# Largest output buffer a `read_back` stream puts in host memory (see `Stream`): the largest
# measured. On the H200 an eager quantize_per_tensor call took 94.7 / 209.4 / 788.5 / 1881.6 us
# at 64 / 16Ki / 1Mi / 4Mi int8 outputs in device memory, 93.3 / 98.9 / 594.5 / 1688.9 us in
# host memory (benchmarks/NOTES.md, session 7).
HOST_OUTPUT_BYTES = 4 << 20
# device -> {(storage, dtype name): zero-filled Tensor} bound for omitted optional tensors
_DUMMIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _destroy_stream(lib, null, device, pool, command_buffers, fence, descriptor_pools, query_pools):
    for query_pool in query_pools:
        lib.vkDestroyQueryPool(device, query_pool, null)
    for descriptor_pool in descriptor_pools:
        lib.vkDestroyDescriptorPool(device, descriptor_pool, null)
    lib.vkDestroyFence(device, fence, null)
    lib.vkFreeCommandBuffers(device, pool, 1, command_buffers)


class _Resources:
    """What a stream records and submits with: command buffer, fence, pools, pre-built structs.

    Pools grow as a recording needs; `reset()` makes everything reusable and
    `destroy()` (tracked by the device) frees it.
    """

    def __init__(self, device):
        vk, ffi, lib = raw.load()
        self.command_buffers = ffi.new("VkCommandBuffer[]", 1)
        alloc = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": device.command_pool, "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            "commandBufferCount": 1})
        raw.check(lib.vkAllocateCommandBuffers(device.handle, alloc, self.command_buffers),
                  "vkAllocateCommandBuffers")
        self.cb = self.command_buffers[0]
        try:
            self.fence = device.create_fence()
        except BaseException:
            lib.vkFreeCommandBuffers(device.handle, device.command_pool, 1, self.command_buffers)
            raise
        self.fences = ffi.new("VkFence[]", [self.fence])
        self.descriptor_pools, self.query_pools = [], []
        self.pending = False  # submitted and not yet waited for
        self.writes: dict = {}  # Pipeline -> writes_for() template
        self.signature = None  # what the command buffer holds (Stream._signature), None if nothing
        self.bound: tuple = ()  # weak references to the allocations the recording binds
        self.timed: list[tuple] = []  # its timestamp queries: (label, pool, first index)
        self.used = False  # recorded into (or tried to) since the last reset
        self.destroy = device.track(
            self, _destroy_stream, lib, ffi.NULL, device.handle, device.command_pool,
            self.command_buffers, self.fence, self.descriptor_pools, self.query_pools)
        self.submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": 1,
            "pCommandBuffers": self.command_buffers})
        self.begin_info = ffi.new("VkCommandBufferBeginInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO})
        self.set_layouts = ffi.new("VkDescriptorSetLayout[]", 1)
        self.set = ffi.new("VkDescriptorSet[]", 1)
        self.set_alloc = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorSetCount": 1,
            "pSetLayouts": self.set_layouts})
        compute, shader = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_ACCESS_SHADER_WRITE_BIT
        shader_rw = vk.VK_ACCESS_SHADER_READ_BIT | shader
        self.begin_barrier = raw.Barrier(
            vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT | compute,
            vk.VK_ACCESS_HOST_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT | shader, compute, shader_rw)
        self.between_barrier = raw.Barrier(compute, shader, compute, shader_rw)
        self.end_barrier = raw.Barrier(
            compute, shader, vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)

    def writes_for(self, pipeline, info) -> tuple:
        """Pre-filled descriptor writes of `pipeline`: (writes, buffer infos, image infos).

        Only the set, buffers and views are left to fill per dispatch.
        """
        template = self.writes.get(pipeline)
        if template is None:
            vk, ffi, _ = raw.load()
            count = len(info.interface.bindings)
            buffer_infos = ffi.new("VkDescriptorBufferInfo[]", count)
            image_infos = ffi.new("VkDescriptorImageInfo[]", count)
            writes = ffi.new("VkWriteDescriptorSet[]", count)
            for i, binding in enumerate(info.interface.bindings):
                write = writes[i]
                write.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
                write.dstBinding, write.descriptorCount = binding.binding, 1
                if binding.storage in IMAGE_STORAGES:
                    image_infos[i].imageLayout = vk.VK_IMAGE_LAYOUT_GENERAL
                    write.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE
                    write.pImageInfo = image_infos + i
                else:
                    write.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                    write.pBufferInfo = buffer_infos + i
            template = self.writes[pipeline] = (writes, buffer_infos, image_infos)
        return template

    def reset(self, device) -> None:
        """Make the command buffer and descriptor pools ready for a new recording."""
        _, _, lib = raw.load()
        raw.check(lib.vkResetCommandBuffer(self.cb, 0), "vkResetCommandBuffer")
        for pool in self.descriptor_pools:
            raw.check(lib.vkResetDescriptorPool(device.handle, pool, 0), "vkResetDescriptorPool")
        self.signature, self.bound, self.timed, self.used = None, (), [], False


class Stream:
    """Records dispatches into one command buffer; `run()` submits and waits.

    Args:
        device: the `Device`; default `get_device()`.
        allocate: where `empty()` gets its tensors: a function of (shape, dtype,
            storage, label, layout) returning a `Tensor` (a loaded program plans
            its memory through it); default `Tensor.empty`.
        read_back: the host reads the outputs once the stream has run (an eager op
            call): `empty()` then puts output buffers of at most `HOST_OUTPUT_BYTES`
            in host memory ("host" placement), where the host reads them at memory
            speed; a discrete GPU's mapped device memory is read uncached over the bus.
        constants: ``id(host tensor) -> Constant`` for host tensors that `upload()` should
            keep on the device across streams (a loaded program's constants, shared by its
            recordings); None: every upload is the stream's own.
        timestamps: bracket each dispatch with timestamp queries (`timings`, `gpu_seconds`)
            where the device has them; a loaded program replays its streams without them
            (each costs GPU time and orders the dispatches around it) and profiles a
            `timed_twin`.

    Attributes:
        dispatched: (op, variant name) of every dispatch recorded so far, in order.
    """

    def __init__(self, device=None, allocate=None, read_back: bool = False, constants: dict | None = None,
                 timestamps: bool = True):
        vk, ffi, lib = raw.load()
        if device is None:
            device = get_device()
        device.require_open()
        self.device, self._vk, self._ffi, self._lib = device, vk, ffi, lib
        self._resources: _Resources | None = None  # taken by finish()
        self._timestamps = timestamps and device.caps.timestamps
        self._allocate = allocate
        self._host_outputs = HOST_OUTPUT_BYTES if read_back else 0
        self._acquired: list[Tensor] = []  # what upload() and empty() made, in order
        # Set to a list to collect (host torch tensor, the device Tensor upload() made of it)
        # pairs (call plans do); None: host tensors are not kept.
        self.uploads: list[tuple] | None = None
        self._constants = constants
        self._state = "empty"  # -> "recording" (dispatches noted) -> "ready" (recorded); "closed"
        self._reset_recording()

    # -- tensors --------------------------------------------------------------------

    def upload(self, value, binding, label: str | None = None,
               layout: str | None = None) -> Tensor | None:
        """A device tensor for `binding` (a `BindingInfo`) holding `value`.

        Args:
            value: a torch tensor (converted to the binding's dtype), a device
                `Tensor` of the binding's dtype and storage (used as is), or a
                `Constant` (uploaded once per device, then reused), or None
                (returned as is: an omitted optional tensor).
            binding: where the tensor will be bound.
            label: what it is, for errors (e.g. "etvk.x.default: argument 'input'").
            layout: None (the storage's default) or a packed int8 layout.

        Raises:
            DispatchError: a device tensor of another dtype, storage or layout.
            TensorTooLarge: over the device's limits for the binding's storage.
        """
        label = label or f"binding '{binding.name}'"
        dtype = dtype_info(binding.dtype, label).torch_dtype
        if value is None:  # an omitted optional tensor: dispatch binds a dummy
            return None
        if self._constants is not None and id(value) in self._constants:
            value = self._constants[id(value)]
        if isinstance(value, Constant):
            return value.on_device(self.device, dtype, binding.storage, label, layout)
        if isinstance(value, Tensor):
            if value.dtype != dtype or value.storage != binding.storage:
                raise DispatchError(f"{label}: device tensor is {value.dtype} {value.storage}, "
                                    f"binding '{binding.name}' needs {dtype} {binding.storage}")
            if layout is not None and value.layout != layout:
                raise DispatchError(f"{label}: device tensor has layout {value.layout}, "
                                    f"this call needs {layout}")
            return value
        tensor = Tensor.from_torch(value, binding.storage, dtype, label, self.device, layout)
        self._acquired.append(tensor)
        if self.uploads is not None:
            self.uploads.append((value, tensor))
        return tensor

    def empty(self, shape, dtype, binding, label: str | None = None,
              layout: str | None = None, scratch: bool = False) -> Tensor:
        """A device tensor of `shape` for `binding`, not initialised: the shader writes all of it.

        `scratch`: only the call's own dispatches read it (else it is an output).

        Raises:
            DispatchError: `dtype` is not the binding's dtype (a spec bug).
            TensorTooLarge: over the device's limits for the binding's storage.
        """
        label = label or f"binding '{binding.name}'"
        if dtype_info(dtype, label).name != binding.dtype:
            raise DispatchError(f"{label}: dtype {dtype} differs from binding '{binding.name}' "
                                f"dtype {binding.dtype} (a spec bug)")
        if self._allocate is not None:
            return self._allocate(shape, dtype, binding.storage, label, layout)
        placement = "auto"
        if (self._host_outputs and not scratch and binding.storage == "buffer"
                and buffer_bytes(shape, dtype, layout) <= self._host_outputs):
            placement = "host"
        tensor = Tensor.empty(shape, dtype, binding.storage, label, self.device, layout, placement)
        self._acquired.append(tensor)
        return tensor

    # -- recording ------------------------------------------------------------------

    def dispatch(self, kernel, op: str, *, bindings: dict, push: dict, global_size=None,
                 groups=None, spec_constants: dict | None = None) -> None:
        """Record one dispatch of `kernel` for op `op` (checked now, written at `finish()`).

        Args:
            kernel: the shader variant, a `runtime.vulkan.interface.Kernel` (e.g. a `VariantInfo`).
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
        self._require_stream()
        fields = layout(kernel)
        if bindings.keys() != fields.binding_names:
            check_names(op, kernel, "bindings", fields.binding_names, bindings)
        push_data = pack_push(kernel, op, push)
        counts, global_size = group_counts(kernel.interface.workgroup, global_size, groups)
        if 0 in counts:
            return
        counts = tuple(fold_groups(counts, self.device.caps.limits.max_compute_work_group_count))
        pipeline = self.device.pipelines.get(kernel, spec_constants)
        memories = [self._memory_for(binding, image, dtype, bindings[binding.name])
                    for binding, image, dtype in fields.bindings]
        if self._state == "ready":  # a new recording after run()
            self._reset_recording()
        self._ops.append((pipeline, kernel, memories, push_data, counts))
        self._access.append(tuple(binding.access for binding, _, _ in fields.bindings))
        self._state = "recording"
        self._keepalive.append(bindings)
        self.dispatched.append((op, kernel.name))
        self._traced.append({"op": op, "variant": kernel.name, "global": global_size,
                             "local": list(kernel.interface.workgroup), "groups": counts,
                             "device": self.device.caps.name})
        self.retrace(self._traced[-1:])

    def retrace(self, entries: list[dict] | None = None) -> None:
        """Append `entries` (default: every dispatch of the recording) to the dispatch trace
        file ETVK_TRACE_DISPATCH names, if any: a replay of a recording ran them again."""
        trace = os.environ.get("ETVK_TRACE_DISPATCH")
        if trace:
            with open(trace, "a") as f:
                for entry in self._traced if entries is None else entries:
                    f.write(json.dumps(entry) + "\n")

    def _memory_for(self, binding, image: bool, dtype, tensor):
        """The allocation bound for `tensor` (a dummy when it is None or empty)."""
        if tensor is not None and tensor.memory is not None:
            if tensor.device is not self.device:
                raise DispatchError(f"binding '{binding.name}': {tensor!r} lives on another device")
            if tensor.storage != binding.storage or tensor.dtype != dtype:
                raise DispatchError(f"binding '{binding.name}' needs {binding.dtype} {binding.storage}, "
                                    f"got {tensor!r}")
            return tensor.memory
        dummies, key = _DUMMIES.setdefault(self.device, {}), (binding.storage, binding.dtype)
        if key not in dummies:
            dummies[key] = Tensor.zeros([4], dtype, binding.storage, "dummy binding", self.device)
        return dummies[key].memory

    def _write_descriptors(self, pipeline, info, memories: list):
        ffi, lib, res = self._ffi, self._lib, self._resources
        pools = res.descriptor_pools
        res.set_layouts[0] = pipeline.set_layout
        result = OUT_OF_POOL[0]
        while result in OUT_OF_POOL:
            if self._pool_index == len(pools):
                self._new_descriptor_pool()
            res.set_alloc.descriptorPool = pools[self._pool_index]
            result = lib.vkAllocateDescriptorSets(self.device.handle, res.set_alloc, res.set)
            if result in OUT_OF_POOL:
                self._pool_index += 1
        raw.check(result, "vkAllocateDescriptorSets")
        descriptor_set = res.set[0]
        writes, buffer_infos, image_infos = res.writes_for(pipeline, info)
        for i, ((_, image, _), memory) in enumerate(zip(layout(info).bindings, memories, strict=True)):
            writes[i].dstSet = descriptor_set
            if image:
                image_infos[i].imageView = memory.view
            else:
                buffer_infos[i].buffer, buffer_infos[i].range = memory.handle, memory.nbytes
        lib.vkUpdateDescriptorSets(self.device.handle, len(writes), writes, 0, ffi.NULL)
        return descriptor_set

    def _new_descriptor_pool(self):
        vk, ffi, lib = self._vk, self._ffi, self._lib
        sizes = ffi.new("VkDescriptorPoolSize[]", [
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, "descriptorCount": 8 * POOL_SETS},
            {"type": vk.VK_DESCRIPTOR_TYPE_STORAGE_IMAGE, "descriptorCount": 8 * POOL_SETS}])
        info = ffi.new("VkDescriptorPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, "maxSets": POOL_SETS,
            "poolSizeCount": 2, "pPoolSizes": sizes})
        pool = ffi.new("VkDescriptorPool*")
        raw.check(lib.vkCreateDescriptorPool(self.device.handle, info, ffi.NULL, pool),
                  "vkCreateDescriptorPool")
        self._resources.descriptor_pools.append(pool[0])

    def _next_queries(self, label: str):
        """Reserve two timestamp queries for one dispatch: (pool, first index), or None."""
        if not self._timestamps:
            return None
        used, pools = len(self._timed) * 2, self._resources.query_pools
        if used // QUERIES_PER_POOL >= len(pools):
            vk, ffi, lib = self._vk, self._ffi, self._lib
            info = ffi.new("VkQueryPoolCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                "queryType": vk.VK_QUERY_TYPE_TIMESTAMP, "queryCount": QUERIES_PER_POOL})
            pool = ffi.new("VkQueryPool*")
            raw.check(lib.vkCreateQueryPool(self.device.handle, info, ffi.NULL, pool),
                      "vkCreateQueryPool")
            pools.append(pool[0])
        pool = pools[used // QUERIES_PER_POOL]
        if used % QUERIES_PER_POOL == 0:
            self._lib.vkCmdResetQueryPool(self._resources.cb, pool, 0, QUERIES_PER_POOL)
        query = (pool, used % QUERIES_PER_POOL)
        self._timed.append((label, *query))
        return query

    def _reset_recording(self) -> None:
        self.dispatched = []
        self._traced: list[dict] = []  # the dispatch trace entries of the recording
        self._keepalive: list = []
        self._ops: list[tuple] = []  # (pipeline, kernel, allocations, push bytes, group counts)
        self._access: list[tuple] = []  # each op's bindings' access ("read", "write", "read_write")
        self._timed: list[tuple] = []
        self._pool_index = 0

    def _signature(self) -> tuple:
        """What the noted dispatches would record: pipelines, allocation serials and bound sizes,
        push bytes, group counts."""
        return (self._timestamps, *((pipeline.handle, tuple((m.serial, m.nbytes) for m in memories),
                                     push_data, counts) for pipeline, _, memories, push_data, counts in self._ops))

    def _record(self, signature: tuple) -> None:
        """Write the noted dispatches into the command buffer (reset first if it held others)."""
        res, lib, vk = self._resources, self._lib, self._vk
        cb, sets = res.cb, res.set
        if res.used:
            res.reset(self.device)
        res.used = True
        self._pool_index = 0
        self._timed = []
        raw.check(lib.vkBeginCommandBuffer(cb, res.begin_info), "vkBeginCommandBuffer")
        res.begin_barrier.record(cb)
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        bound = {}
        written, read = set(), set()  # allocations dispatches since the last barrier wrote, read
        for (pipeline, kernel, memories, push_data, counts), access in zip(self._ops, self._access, strict=True):
            writes = {m.serial for m, a in zip(memories, access, strict=True) if a != "read"}
            reads = {m.serial for m, a in zip(memories, access, strict=True) if a != "write"}
            if reads & written or writes & (written | read):
                res.between_barrier.record(cb)
                written, read = set(), set()
            written |= writes
            read |= reads
            for memory in memories:
                bound[memory.serial] = memory
            descriptor_set = self._write_descriptors(pipeline, kernel, memories)
            query = self._next_queries(kernel.name)
            if query:
                lib.vkCmdWriteTimestamp(cb, compute, query[0], query[1])
            lib.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.handle)
            sets[0] = descriptor_set
            lib.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipeline.layout,
                                        0, 1, sets, 0, self._ffi.NULL)
            if push_data:
                lib.vkCmdPushConstants(cb, pipeline.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0,
                                       len(push_data), self._ffi.from_buffer(push_data))
            lib.vkCmdDispatch(cb, *counts)
            if query:
                lib.vkCmdWriteTimestamp(cb, compute, query[0], query[1] + 1)
        res.end_barrier.record(cb)
        raw.check(lib.vkEndCommandBuffer(cb), "vkEndCommandBuffer")
        res.bound = tuple(memory.allocation_ref() for memory in bound.values())
        res.signature, res.timed = signature, self._timed

    def _require_stream(self) -> None:
        self.device.require_open()
        if self._state == "closed":
            raise DispatchError("this stream was closed")

    # -- submission -----------------------------------------------------------------

    def finish(self) -> None:
        """End the recording without submitting it; `replay()` submits it. Nothing recorded: no-op.

        The Vulkan commands are written here, unless the device's `recordings` hand back a
        command buffer that holds exactly these dispatches (see the module docstring)."""
        self._require_stream()
        if self._state == "recording":
            signature = self._signature()
            res, recordings = self._resources, self.device.recordings
            if res is None or res.signature != signature:
                if res is not None:  # it holds other dispatches: a later stream may want them
                    self._resources = None
                    self._give_back(res)
                res = self._resources = recordings.take(signature) or _Resources(self.device)
            if res.signature != signature or not recordings.reuse:
                self._record(signature)
            self._timed = list(res.timed)
            self._state = "ready"

    @property
    def recorded(self) -> bool:
        """Whether a finished recording is ready to `replay()`."""
        return self._state == "ready"

    def run(self) -> None:
        """Finish recording, submit and wait. A stream with no dispatches does nothing.

        Raises:
            VulkanError: submission or wait failed.
        """
        self.finish()
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
        device = self.device
        device.require_open()
        lib, handle, res = self._lib, device.handle, self._resources
        res.pending = True  # until the fence is waited for and reset: not reusable
        raw.check(lib.vkQueueSubmit(device.queue, 1, res.submit, res.fence), "vkQueueSubmit")
        status = NOT_READY
        if device.fence_spin:  # poll first: a blocked thread takes tens of microseconds to wake
            end = time.perf_counter() + device.fence_spin
            while (status := lib.vkGetFenceStatus(handle, res.fence)) == NOT_READY:
                if time.perf_counter() > end:
                    break
        if status == NOT_READY:
            status = lib.vkWaitForFences(handle, 1, res.fences, 1, 2**64 - 1)
        raw.check(status, "vkWaitForFences")
        raw.check(lib.vkResetFences(handle, 1, res.fences), "vkResetFences")
        res.pending = False

    def timed_twin(self) -> Stream:
        """A stream of this finished recording's dispatches on the same tensors, recorded with
        timestamps (for profiling a stream recorded without them).

        Raises:
            DispatchError: nothing was recorded yet.
        """
        if self._state != "ready":
            raise DispatchError("timed_twin() needs a finished recording")
        twin = Stream(self.device, timestamps=True)
        twin._ops, twin._access = list(self._ops), list(self._access)
        twin._keepalive, twin.dispatched = list(self._keepalive), list(self.dispatched)
        twin._state = "recording"
        twin.finish()
        return twin

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

    def gpu_seconds(self) -> float | None:
        """Seconds from the first dispatch's start to the last one's end in the last run
        (barriers between dispatches included), from timestamps; None without them."""
        if self._state != "ready" or not self._timed:
            return None
        ffi, lib = self._ffi, self._lib
        stamps = ffi.new("uint64_t[2]")
        flags = self._vk.VK_QUERY_RESULT_64_BIT | self._vk.VK_QUERY_RESULT_WAIT_BIT
        for slot, (_, pool, index) in ((0, self._timed[0]), (1, self._timed[-1])):
            status = lib.vkGetQueryPoolResults(self.device.handle, pool, index + slot, 1, 8,
                                               stamps + slot, 8, flags)
            if status != 0:
                raise VulkanError(status, "vkGetQueryPoolResults")
        bits = self.device.timestamp_valid_bits
        mask = (1 << bits) - 1 if bits < 64 else -1
        return ((stamps[1] - stamps[0]) & mask) * self.device.caps.timestamp_period * 1e-9

    def close(self) -> None:
        """Give the command buffer and pools (still recorded) to the next stream; idempotent.

        Tensors stay valid; the stream cannot record or run any more.
        """
        res, self._resources = self._resources, None
        if res is not None:
            self._give_back(res)
        self._state = "closed"
        self._reset_recording()
        # The tensors nobody else holds go back to the spare memory last made first, so that a
        # stream making the same tensors in the same order next gets the same allocations in
        # the same roles (the spare memory hands back the newest first) and reuses this recording.
        acquired, self._acquired = self._acquired, []
        self.uploads = None
        while acquired:
            acquired.pop()

    def _give_back(self, res: _Resources) -> None:
        """Keep `res` (still recorded) for later streams, unless it cannot be reused."""
        if self.device.closed or res.pending:
            res.destroy()
        else:
            self.device.recordings.give(res.signature, res, res.bound)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
