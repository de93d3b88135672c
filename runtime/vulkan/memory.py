"""Device memory: storage buffers and 3-D storage images, with host copies.

A `Buffer` lives in memory that is device-local and host-visible-coherent
where the device has it (mapped once, copied with memmove), else device-local
with a temporary host-visible staging buffer, else host-visible. Staging
buffers, and results the host reads back ("host" placement: an eager call's
small outputs), prefer host-cached system memory. The host reads device-local mapped
memory (a GPU's BAR) uncached, at PCIe read latency (on the H100, programs
whose CPU nodes read device tensors that way spent about a second per call:
benchmarks/NOTES.md), so reads of more than `DIRECT_READ_LIMIT` bytes from it go through a
staging copy instead. An `Image3D`
is an optimal-tiling 3-D storage image kept in layout GENERAL, copied through
staging buffers. Each holds an `_Allocation` (the Vulkan objects and the
mapped view), which goes back to the device's `spare_memory` when its holder
is collected and is taken again by the next buffer of the same placement and
size class (or image of the same format and extent); allocations are
destroyed when evicted or at device close. New memory is not initialised.
Copies of host data are single memmoves from raw pointers, with one-shot
command buffers and full barriers around every transfer. It must not know
dtypes or shapes (tensor.py does). Called by tensor.py and stream.py (dummy
bindings).
"""

from __future__ import annotations

import ctypes
import itertools
import weakref

from runtime.vulkan import raw

PLACEMENTS = ("auto", "host", "device")
SMALLEST_CLASS = 256
# Mapped device-local memory (a discrete GPU's BAR) larger than this is zeroed by the device
# (vkCmdFillBuffer) rather than by host writes across the bus. H200, session 28: a 512-token
# prefill's wall time exceeded its GPU time by 4.5 ms while reset() memset its 84 MB of KV
# cache that way (benchmarks/NOTES.md).
HOST_FILL_LIMIT = 1 << 20
# Larger reads of device-local mapped memory go through a host-cached staging copy (one
# submission) rather than uncached loads over PCIe. Measured on the H200: direct 2.5 / 18.3 /
# 65.1 / 269.8 us at 64 B / 1 / 4 / 16 KiB, staged 59.1 / 74.3 / 74.1 / 92.3 us.
DIRECT_READ_LIMIT = 4096


def size_class(nbytes: int, limit: int) -> int:
    """The allocation size for `nbytes`: at least 256, rounded up to 4, 5, 6 or 7 times a power of two.

    Args:
        nbytes: the bytes asked for.
        limit: never round above this (unless `nbytes` itself is).

    Returns:
        At most 25% more than `nbytes`, so that freed memory is reused by near sizes.
    """
    if nbytes <= SMALLEST_CLASS:
        rounded = SMALLEST_CLASS
    else:
        step = 1 << (nbytes.bit_length() - 3)
        rounded = -(-nbytes // step) * step
    return max(nbytes, min(rounded, limit))


def choose_memory_type(type_flags: list[int], type_bits: int, preferences: list[int]) -> int | None:
    """Pick a memory type index.

    Args:
        type_flags: VkMemoryPropertyFlags of each memory type of the device.
        type_bits: VkMemoryRequirements.memoryTypeBits of the resource.
        preferences: required flag sets, best first.

    Returns:
        The first allowed type that has every flag of the earliest satisfiable
        preference, or None.
    """
    for wanted in preferences:
        for index, flags in enumerate(type_flags):
            if type_bits & (1 << index) and flags & wanted == wanted:
                return index
    return None


def _address(pointer) -> int:
    _, ffi, _ = raw.load()
    return int(ffi.cast("uintptr_t", pointer))


def _allocate(device, requirements, preferences, what: str):
    vk, ffi, lib = raw.load()
    index = choose_memory_type(device.memory_types, requirements.memoryTypeBits, preferences)
    if index is None:
        raise MemoryError(f"{device.caps.name} has no suitable memory type for {what}")
    info = ffi.new("VkMemoryAllocateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        "allocationSize": requirements.size, "memoryTypeIndex": index})
    memory = ffi.new("VkDeviceMemory*")
    raw.check(lib.vkAllocateMemory(device.handle, info, ffi.NULL, memory),
              f"vkAllocateMemory ({requirements.size} bytes for {what})")
    return memory[0], device.memory_types[index]


_SERIALS = itertools.count()


def _destroy_buffer(lib, null, device, buffer, memory):
    lib.vkDestroyBuffer(device, buffer, null)
    lib.vkFreeMemory(device, memory, null)


def _destroy_image(lib, null, device, image, view, memory):
    lib.vkDestroyImageView(device, view, null)
    lib.vkDestroyImage(device, image, null)
    lib.vkFreeMemory(device, memory, null)


class _Allocation:
    """A buffer or image with its memory (and mapped address or view); `destroy()` frees them."""

    def __init__(self, device, nbytes: int, handle, memory, view=None):
        self.nbytes, self.handle, self.view, self.mapped = nbytes, handle, view, None
        self.serial = next(_SERIALS)  # never reused, unlike handles: streams key recordings by it
        self.uncached_reads = False  # mapped device-local memory without HOST_CACHED
        self.device_local = False  # mapped device-local memory (a discrete GPU's BAR)
        _, ffi, lib = raw.load()
        if view is None:
            self.destroy = device.track(self, _destroy_buffer, lib, ffi.NULL, device.handle, handle, memory)
        else:
            self.destroy = device.track(self, _destroy_image, lib, ffi.NULL, device.handle, handle, view,
                                        memory)


def _transfer(device, what: str, command) -> None:
    """Record `command(cb)` between full barriers in a one-shot submission and wait for it."""
    barrier = raw.full_barrier()

    def record(cb):
        barrier.record(cb)
        command(cb)
        barrier.record(cb)

    device.run_once(record, what)


def zero_all(memories) -> None:
    """Fill every buffer or image of `memories` (all of one device) with zeros: buffers in host
    memory, and small ones mapped from device memory, on the host (`Buffer.host_fill`); the
    others in one submission (a decoder's reset zeroes dozens of caches: one wait instead of
    one per cache, and no host writes across the bus into device memory)."""
    on_device = []
    for memory in memories:
        memory.device.require_open()
        if memory.host_fill:
            ctypes.memset(memory.mapped, 0, memory.nbytes)
        else:
            on_device.append(memory)
    if on_device:
        def record(cb):
            for memory in on_device:
                memory.record_zero(cb)
        _transfer(on_device[0].device, "zero fill", record)


class _Holder:
    """Gives its `_Allocation` back to the device's spare memory when collected.

    `__del__` rather than `weakref.finalize`: it costs a fraction on the hot
    path (a tensor per op argument and output).
    """

    _allocation = None

    def _hold(self, device, key, allocation) -> None:
        self._spare, self._key, self._allocation = device.spare_memory, key, allocation
        self.serial = allocation.serial

    def allocation_ref(self) -> weakref.ref:
        """A weak reference to the allocation, dead once it is destroyed and let go (evicted from
        the spare memory): stream recordings that bind it are then written over first."""
        return weakref.ref(self._allocation)

    def __del__(self):
        allocation = self._allocation
        # When a reference cycle held this object, the garbage collector has already run the
        # allocation's finalizer (weak reference callbacks come before `__del__`): its buffer
        # or image is destroyed, and handing it on would bind a destroyed handle.
        if allocation is not None and allocation.destroy.alive:
            self._spare.give(self._key, allocation)


def _new_buffer(device, size: int, placement: str) -> _Allocation:
    vk, ffi, lib = raw.load()
    info = ffi.new("VkBufferCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": size,
        "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
        | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
        "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
    buffer = ffi.new("VkBuffer*")
    raw.check(lib.vkCreateBuffer(device.handle, info, ffi.NULL, buffer), "vkCreateBuffer")
    requirements = ffi.new("VkMemoryRequirements*")
    lib.vkGetBufferMemoryRequirements(device.handle, buffer[0], requirements)
    host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    local, cached = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
    preferences = {"auto": [local | host, local, host], "host": [host | cached, host], "device": [local]}
    try:
        memory, flags = _allocate(device, requirements, preferences[placement], f"a {size}-byte buffer")
    except BaseException:
        lib.vkDestroyBuffer(device.handle, buffer[0], ffi.NULL)
        raise
    allocation = _Allocation(device, size, buffer[0], memory)
    raw.check(lib.vkBindBufferMemory(device.handle, buffer[0], memory, 0), "vkBindBufferMemory")
    if placement != "device" and flags & host == host:
        pointer = ffi.new("void**")
        raw.check(lib.vkMapMemory(device.handle, memory, 0, requirements.size, 0, pointer), "vkMapMemory")
        allocation.mapped = _address(pointer[0])
        allocation.uncached_reads = bool(flags & local) and not flags & cached
        allocation.device_local = bool(flags & local)
    return allocation


class Buffer(_Holder):
    """A storage buffer of `nbytes` (> 0) bytes, not initialised.

    Args:
        device: the owning `Device`.
        nbytes: size in bytes.
        placement: "auto" (device-local and mapped if possible), "host"
            (host-visible, mapped: staging) or "device" (device-local, never
            mapped: copies go through staging).

    Attributes:
        handle: the VkBuffer (possibly larger than `nbytes`: its size class).
        mapped: the host address of its memory, or None when staged.
        placement: as asked.
        device_local: mapped from device-local memory.
        host_fill: `zero_all` fills it on the host (mapped host memory, or device-local memory
            of at most `HOST_FILL_LIMIT` bytes).
    """

    def __init__(self, device, nbytes: int, placement: str = "auto"):
        if nbytes <= 0 or placement not in PLACEMENTS:
            raise ValueError(f"Buffer needs nbytes > 0 and a placement in {PLACEMENTS}")
        device.require_open()
        self.device, self.nbytes, self.placement = device, nbytes, placement
        size = size_class(nbytes, device.caps.limits.max_memory_allocation_size)
        key = ("buffer", placement, size)
        allocation = device.spare_memory.take(key) or _new_buffer(device, size, placement)
        self.handle, self.mapped = allocation.handle, allocation.mapped
        self.uncached_reads, self.device_local = allocation.uncached_reads, allocation.device_local
        self.host_fill = allocation.mapped is not None and (
            not allocation.device_local or nbytes <= HOST_FILL_LIMIT)
        self._hold(device, key, allocation)

    def write(self, source: int, nbytes: int) -> None:
        """Copy `nbytes` from host address `source` to the start; zero the rest."""
        self.device.require_open()
        if self.mapped is not None:
            ctypes.memmove(self.mapped, source, nbytes)
            if nbytes < self.nbytes:
                ctypes.memset(self.mapped + nbytes, 0, self.nbytes - nbytes)
            return
        staging = Buffer(self.device, self.nbytes, "host")
        staging.write(source, nbytes)
        self._copy(staging, self, "buffer upload")

    def read(self, destination: int, nbytes: int, offset: int = 0) -> None:
        """Copy `nbytes` from byte `offset` on to host address `destination`."""
        self.device.require_open()
        if self.mapped is not None and not (self.uncached_reads and nbytes > DIRECT_READ_LIMIT):
            ctypes.memmove(destination, self.mapped + offset, nbytes)
            return
        staging = Buffer(self.device, nbytes, "host")
        self._copy(self, staging, "buffer download", offset)
        staging.read(destination, nbytes)

    def zero(self) -> None:
        """Fill the whole buffer with zero bytes."""
        zero_all([self])

    def record_zero(self, cb) -> None:
        """Record the fill of the whole (unmapped) buffer with zero bytes into `cb`."""
        _, _, lib = raw.load()
        lib.vkCmdFillBuffer(cb, self.handle, 0, self.nbytes, 0)

    def copy_from(self, source: Buffer) -> None:
        """Copy this buffer's `nbytes` from the start of `source` (at least as large), on the device."""
        if source.nbytes < self.nbytes or source.device is not self.device:
            raise ValueError(f"copy of {self.nbytes} bytes from a buffer of {source.nbytes} on "
                             f"{'another' if source.device is not self.device else 'this'} device")
        self.device.require_open()
        self._copy(source, self, "buffer copy")

    def _copy(self, source: Buffer, destination: Buffer, what: str, source_offset: int = 0) -> None:
        _, _, lib = raw.load()
        region = raw.new("VkBufferCopy", srcOffset=source_offset,
                         size=min(source.nbytes - source_offset, destination.nbytes))
        _transfer(self.device, what,
                  lambda cb: lib.vkCmdCopyBuffer(cb, source.handle, destination.handle, 1, region))


def _new_image(device, extent: tuple, vk_format: int, nbytes: int, subrange: dict,
               dims: int) -> _Allocation:
    """Create a 3-D (or 2-D) storage image with memory and view, in layout GENERAL."""
    vk, ffi, lib = raw.load()
    info = ffi.new("VkImageCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO,
        "imageType": vk.VK_IMAGE_TYPE_2D if dims == 2 else vk.VK_IMAGE_TYPE_3D,
        "format": vk_format, "extent": dict(zip(("width", "height", "depth"), extent, strict=True)),
        "mipLevels": 1, "arrayLayers": 1, "samples": vk.VK_SAMPLE_COUNT_1_BIT,
        "tiling": vk.VK_IMAGE_TILING_OPTIMAL,
        "usage": vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
        | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT,
        "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE,
        "initialLayout": vk.VK_IMAGE_LAYOUT_UNDEFINED})
    out = ffi.new("VkImage*")
    raw.check(lib.vkCreateImage(device.handle, info, ffi.NULL, out), "vkCreateImage")
    image, memory, view = out[0], ffi.NULL, ffi.NULL
    try:
        requirements = ffi.new("VkMemoryRequirements*")
        lib.vkGetImageMemoryRequirements(device.handle, image, requirements)
        memory, _ = _allocate(device, requirements, [vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0],
                              f"a {extent} image")
        raw.check(lib.vkBindImageMemory(device.handle, image, memory, 0), "vkBindImageMemory")
        view_info = ffi.new("VkImageViewCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, "image": image,
            "viewType": vk.VK_IMAGE_VIEW_TYPE_2D if dims == 2 else vk.VK_IMAGE_VIEW_TYPE_3D,
            "format": vk_format, "subresourceRange": subrange})
        out = ffi.new("VkImageView*")
        raw.check(lib.vkCreateImageView(device.handle, view_info, ffi.NULL, out), "vkCreateImageView")
        view = out[0]
    except BaseException:
        _destroy_image(lib, ffi.NULL, device.handle, image, view, memory)
        raise
    allocation = _Allocation(device, nbytes, image, memory, view=view)
    to_general = ffi.new("VkImageMemoryBarrier*", {
        "sType": vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER,
        "dstAccessMask": vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT,
        "oldLayout": vk.VK_IMAGE_LAYOUT_UNDEFINED, "newLayout": vk.VK_IMAGE_LAYOUT_GENERAL,
        "srcQueueFamilyIndex": vk.VK_QUEUE_FAMILY_IGNORED,
        "dstQueueFamilyIndex": vk.VK_QUEUE_FAMILY_IGNORED,
        "image": image, "subresourceRange": subrange})

    def record(cb):
        lib.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                 vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 0, ffi.NULL,
                                 0, ffi.NULL, 1, to_general)

    device.run_once(record, "image layout transition")
    return allocation


class Image3D(_Holder):
    """A 3-D storage image (optimal tiling, layout GENERAL) of `extent` texels, not initialised.

    Args:
        device: the owning `Device`.
        extent: (width, height, depth) in texels, each >= 1.
        vk_format: the VkFormat.
        texel_bytes: bytes per texel of `vk_format`.
        dims: 3, or 2 for a 2-D image (depth must then be 1).

    Attributes:
        handle, view: the VkImage and its VkImageView (3-D, or 2-D).
    """

    def __init__(self, device, extent: tuple[int, int, int], vk_format: int, texel_bytes: int,
                 dims: int = 3):
        vk, _, _ = raw.load()
        device.require_open()
        self.device, self.extent, self.nbytes = device, tuple(extent), texel_bytes
        for size in extent:
            self.nbytes *= size
        self._range = {"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "levelCount": 1, "layerCount": 1}
        key = ("image", vk_format, self.extent, dims)
        allocation = device.spare_memory.take(key) or _new_image(device, self.extent, vk_format,
                                                                 self.nbytes, self._range, dims)
        self.handle, self.view = allocation.handle, allocation.view
        self._hold(device, key, allocation)

    def write(self, source: int) -> None:
        """Copy `nbytes` of tightly packed texels (x fastest, then y, then z) from `source`."""
        staging = Buffer(self.device, self.nbytes, "host")
        staging.write(source, self.nbytes)
        self._copy(staging, to_image=True)

    def read(self, destination: int) -> None:
        """Copy every texel, tightly packed, to host address `destination`."""
        staging = Buffer(self.device, self.nbytes, "host")
        self._copy(staging, to_image=False)
        staging.read(destination, self.nbytes)

    host_fill = False  # images are never host-mapped (zero_all reads it)

    def zero(self) -> None:
        """Set every texel to zero."""
        zero_all([self])

    def record_zero(self, cb) -> None:
        """Record the clear of every texel to zero into `cb`."""
        vk, ffi, lib = raw.load()
        color = ffi.new("VkClearColorValue*")
        subrange = raw.new("VkImageSubresourceRange", **self._range)
        lib.vkCmdClearColorImage(cb, self.handle, vk.VK_IMAGE_LAYOUT_GENERAL, color, 1, subrange)

    def _copy(self, staging: Buffer, to_image: bool) -> None:
        vk, _, lib = raw.load()
        region = raw.new(
            "VkBufferImageCopy",
            imageSubresource={"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "layerCount": 1},
            imageExtent=dict(zip(("width", "height", "depth"), self.extent, strict=True)))
        general = vk.VK_IMAGE_LAYOUT_GENERAL
        if to_image:
            _transfer(self.device, "image upload", lambda cb: lib.vkCmdCopyBufferToImage(
                cb, staging.handle, self.handle, general, 1, region))
        else:
            _transfer(self.device, "image download", lambda cb: lib.vkCmdCopyImageToBuffer(
                cb, self.handle, general, staging.handle, 1, region))
