"""Device memory: storage buffers and 3-D storage images, with host copies.

A `Buffer` lives in memory that is device-local and host-visible-coherent
where the device has it (mapped once, copied with memmove), else device-local
with a temporary host-visible staging buffer, else host-visible. An `Image3D`
is an optimal-tiling 3-D storage image kept in layout GENERAL, copied through
staging buffers. The object that owns memory owns its mapped view; memory is
freed when the owner is collected or at device close. Copies of host data are
single memmoves from raw pointers, with one-shot command buffers and full
barriers around every transfer. It must not know dtypes or shapes (tensor.py
does). Called by tensor.py and command.py (dummy bindings).
"""

from __future__ import annotations

import ctypes

from runtime import _vk

PLACEMENTS = ("auto", "host", "device")


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
    _, ffi, _ = _vk.load()
    return int(ffi.cast("uintptr_t", pointer))


def _allocate(device, requirements, preferences, what: str):
    vk, ffi, lib = _vk.load()
    index = choose_memory_type(device.memory_types, requirements.memoryTypeBits, preferences)
    if index is None:
        raise MemoryError(f"{device.caps.name} has no suitable memory type for {what}")
    info = ffi.new("VkMemoryAllocateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
        "allocationSize": requirements.size, "memoryTypeIndex": index})
    memory = ffi.new("VkDeviceMemory*")
    _vk.check(lib.vkAllocateMemory(device.handle, info, ffi.NULL, memory),
              f"vkAllocateMemory ({requirements.size} bytes for {what})")
    return memory[0], device.memory_types[index]


def _destroy_buffer(lib, null, device, buffer, memory):
    lib.vkDestroyBuffer(device, buffer, null)
    lib.vkFreeMemory(device, memory, null)


def _destroy_image(lib, null, device, image, view, memory):
    lib.vkDestroyImageView(device, view, null)
    lib.vkDestroyImage(device, image, null)
    lib.vkFreeMemory(device, memory, null)


class Buffer:
    """A storage buffer of `nbytes` (> 0) bytes.

    Args:
        device: the owning `Device`.
        nbytes: size in bytes.
        placement: "auto" (device-local and mapped if possible), "host"
            (host-visible, mapped: staging) or "device" (device-local, never
            mapped: copies go through staging).

    Attributes:
        handle: the VkBuffer.
        mapped: the host address of its memory, or None when staged.
    """

    def __init__(self, device, nbytes: int, placement: str = "auto"):
        vk, ffi, lib = _vk.load()
        if nbytes <= 0 or placement not in PLACEMENTS:
            raise ValueError(f"Buffer needs nbytes > 0 and a placement in {PLACEMENTS}")
        device.require_open()
        self.device, self.nbytes = device, nbytes
        info = ffi.new("VkBufferCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, "size": nbytes,
            "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
            "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE})
        buffer = ffi.new("VkBuffer*")
        _vk.check(lib.vkCreateBuffer(device.handle, info, ffi.NULL, buffer), "vkCreateBuffer")
        self.handle = buffer[0]
        requirements = ffi.new("VkMemoryRequirements*")
        lib.vkGetBufferMemoryRequirements(device.handle, self.handle, requirements)
        host = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        preferences = {"auto": [local | host, local, host], "host": [host], "device": [local]}
        try:
            self.memory, flags = _allocate(device, requirements, preferences[placement],
                                           f"a {nbytes}-byte buffer")
        except BaseException:
            lib.vkDestroyBuffer(device.handle, self.handle, ffi.NULL)
            raise
        device.track(self, _destroy_buffer, lib, ffi.NULL, device.handle, self.handle, self.memory)
        _vk.check(lib.vkBindBufferMemory(device.handle, self.handle, self.memory, 0),
                  "vkBindBufferMemory")
        self.mapped = None
        if placement != "device" and flags & host == host:
            pointer = ffi.new("void**")
            _vk.check(lib.vkMapMemory(device.handle, self.memory, 0, requirements.size, 0, pointer),
                      "vkMapMemory")
            self.mapped = _address(pointer[0])

    def write(self, source: int, nbytes: int) -> None:
        """Copy `nbytes` from host address `source` to the start; zero the rest."""
        self.device.require_open()
        if self.mapped is not None:
            ctypes.memmove(self.mapped, source, nbytes)
            ctypes.memset(self.mapped + nbytes, 0, self.nbytes - nbytes)
            return
        staging = Buffer(self.device, self.nbytes, "host")
        staging.write(source, nbytes)
        self._copy(staging, self, "buffer upload")

    def read(self, destination: int, nbytes: int) -> None:
        """Copy the first `nbytes` to host address `destination`."""
        self.device.require_open()
        if self.mapped is not None:
            ctypes.memmove(destination, self.mapped, nbytes)
            return
        staging = Buffer(self.device, self.nbytes, "host")
        self._copy(self, staging, "buffer download")
        staging.read(destination, nbytes)

    def zero(self) -> None:
        """Fill the whole buffer with zero bytes."""
        self.device.require_open()
        if self.mapped is not None:
            ctypes.memset(self.mapped, 0, self.nbytes)
            return
        _, _, lib = _vk.load()
        barrier = _vk.full_barrier()

        def record(cb):
            barrier.record(cb)
            lib.vkCmdFillBuffer(cb, self.handle, 0, self.nbytes, 0)
            barrier.record(cb)

        self.device.run_once(record, "buffer zero")

    def _copy(self, source: Buffer, destination: Buffer, what: str) -> None:
        _, _, lib = _vk.load()
        region = _vk.new("VkBufferCopy", size=self.nbytes)
        barrier = _vk.full_barrier()

        def record(cb):
            barrier.record(cb)
            lib.vkCmdCopyBuffer(cb, source.handle, destination.handle, 1, region)
            barrier.record(cb)

        self.device.run_once(record, what)


class Image3D:
    """A 3-D storage image (optimal tiling, layout GENERAL) of `extent` texels.

    Args:
        device: the owning `Device`.
        extent: (width, height, depth) in texels, each >= 1.
        vk_format: the VkFormat.
        texel_bytes: bytes per texel of `vk_format`.

    Attributes:
        handle, view: the VkImage and its 3-D VkImageView.
    """

    def __init__(self, device, extent: tuple[int, int, int], vk_format: int, texel_bytes: int):
        vk, ffi, lib = _vk.load()
        device.require_open()
        self.device, self.extent, self.nbytes = device, tuple(extent), texel_bytes
        for size in extent:
            self.nbytes *= size
        info = ffi.new("VkImageCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO, "imageType": vk.VK_IMAGE_TYPE_3D,
            "format": vk_format, "extent": dict(zip(("width", "height", "depth"), extent, strict=True)),
            "mipLevels": 1, "arrayLayers": 1, "samples": vk.VK_SAMPLE_COUNT_1_BIT,
            "tiling": vk.VK_IMAGE_TILING_OPTIMAL,
            "usage": vk.VK_IMAGE_USAGE_STORAGE_BIT | vk.VK_IMAGE_USAGE_TRANSFER_SRC_BIT
            | vk.VK_IMAGE_USAGE_TRANSFER_DST_BIT,
            "sharingMode": vk.VK_SHARING_MODE_EXCLUSIVE,
            "initialLayout": vk.VK_IMAGE_LAYOUT_UNDEFINED})
        image = ffi.new("VkImage*")
        _vk.check(lib.vkCreateImage(device.handle, info, ffi.NULL, image), "vkCreateImage")
        self.handle = image[0]
        self._range = {"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "levelCount": 1, "layerCount": 1}
        self.memory = self.view = ffi.NULL
        try:
            requirements = ffi.new("VkMemoryRequirements*")
            lib.vkGetImageMemoryRequirements(device.handle, self.handle, requirements)
            self.memory, _ = _allocate(device, requirements,
                                       [vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0],
                                       f"a {extent} image")
            _vk.check(lib.vkBindImageMemory(device.handle, self.handle, self.memory, 0),
                      "vkBindImageMemory")
            view_info = ffi.new("VkImageViewCreateInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO, "image": self.handle,
                "viewType": vk.VK_IMAGE_VIEW_TYPE_3D, "format": vk_format,
                "subresourceRange": self._range})
            view = ffi.new("VkImageView*")
            _vk.check(lib.vkCreateImageView(device.handle, view_info, ffi.NULL, view),
                      "vkCreateImageView")
            self.view = view[0]
        except BaseException:
            _destroy_image(lib, ffi.NULL, device.handle, self.handle, self.view, self.memory)
            raise
        device.track(self, _destroy_image, lib, ffi.NULL, device.handle, self.handle, self.view,
                     self.memory)
        self._to_general()

    def _to_general(self) -> None:
        vk, ffi, lib = _vk.load()
        to_general = ffi.new("VkImageMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_IMAGE_MEMORY_BARRIER,
            "dstAccessMask": vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT,
            "oldLayout": vk.VK_IMAGE_LAYOUT_UNDEFINED, "newLayout": vk.VK_IMAGE_LAYOUT_GENERAL,
            "srcQueueFamilyIndex": vk.VK_QUEUE_FAMILY_IGNORED,
            "dstQueueFamilyIndex": vk.VK_QUEUE_FAMILY_IGNORED,
            "image": self.handle, "subresourceRange": self._range})

        def record(cb):
            lib.vkCmdPipelineBarrier(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT,
                                     vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 0, ffi.NULL,
                                     0, ffi.NULL, 1, to_general)

        self.device.run_once(record, "image layout transition")

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

    def zero(self) -> None:
        """Set every texel to zero."""
        vk, ffi, lib = _vk.load()
        color = ffi.new("VkClearColorValue*")
        subrange = _vk.new("VkImageSubresourceRange", **self._range)
        barrier = _vk.full_barrier()

        def record(cb):
            barrier.record(cb)
            lib.vkCmdClearColorImage(cb, self.handle, vk.VK_IMAGE_LAYOUT_GENERAL, color, 1, subrange)
            barrier.record(cb)

        self.device.run_once(record, "image zero")

    def _copy(self, staging: Buffer, to_image: bool) -> None:
        vk, _, lib = _vk.load()
        region = _vk.new(
            "VkBufferImageCopy",
            imageSubresource={"aspectMask": vk.VK_IMAGE_ASPECT_COLOR_BIT, "layerCount": 1},
            imageExtent=dict(zip(("width", "height", "depth"), self.extent, strict=True)))
        barrier = _vk.full_barrier()
        general = vk.VK_IMAGE_LAYOUT_GENERAL

        def record(cb):
            barrier.record(cb)
            if to_image:
                lib.vkCmdCopyBufferToImage(cb, staging.handle, self.handle, general, 1, region)
            else:
                lib.vkCmdCopyImageToBuffer(cb, self.handle, general, staging.handle, 1, region)
            barrier.record(cb)

        self.device.run_once(record, "image upload" if to_image else "image download")
