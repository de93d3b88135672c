"""Lazy access to the `vulkan` binding's raw C interface, plus small helpers.

The runtime calls Vulkan only through `lib` (the dlopen'ed C functions) and
`ffi` (cffi), never through the binding's Python wrappers: they are slow on
the hot path and raise bare exception classes, some of them for positive
(non-error) result codes. `load()` is the only place that imports `vulkan`,
so `import runtime` works on a machine without a loader. Also pre-built
barriers. Used by every module of the Vulkan layer.
"""

from __future__ import annotations

from runtime.errors import NO_LOADER, VulkanError, VulkanUnavailable

_api = None


def load():
    """Import the binding once and return `(vk, ffi, lib)`.

    Returns:
        The `vulkan` module (for constants), its cffi `ffi` and its `lib`.

    Raises:
        VulkanUnavailable: no Vulkan loader library is installed.
    """
    global _api
    if _api is None:
        try:
            import vulkan
            from vulkan import _vulkan
        except OSError:
            raise VulkanUnavailable(NO_LOADER) from None
        _api = (vulkan, _vulkan.ffi, _vulkan.lib)
    return _api


def check(result: int, call: str) -> None:
    """Raise `VulkanError` unless `result` is VK_SUCCESS.

    Args:
        result: the VkResult a raw call returned.
        call: what was called, for the message.

    Raises:
        VulkanError: `result` is not 0.
    """
    if result != 0:
        raise VulkanError(result, call)


def new(ctype: str, **fields):
    """Allocate a zeroed `ctype` struct with `fields` set and return a pointer to it."""
    _, ffi, _ = load()
    return ffi.new(ctype + "*", fields)


def enumerate_items(ctype: str, fn, *args, stype: int | None = None) -> list:
    """Run a Vulkan two-call enumeration (`fn(*args, count*, items*)`) and return the items
    (extensible structs get `stype` as their sType before the second call; VK_INCOMPLETE
    there returns the items written)."""
    vk, ffi, _ = load()
    count = ffi.new("uint32_t*")
    for items in (ffi.NULL, None):
        if items is None:
            items = ffi.new(ctype + "[]", count[0])
            for i in range(count[0] if stype is not None else 0):
                items[i].sType = stype
        result = fn(*args, count, items)
        # None: a void function; VK_INCOMPLETE from the fill call: fewer items written
        if result is not None and not (items != ffi.NULL and result == vk.VK_INCOMPLETE):
            check(result, "enumerate " + ctype)
    if ffi.typeof(ctype).kind == "struct":  # copies: items of `items` would dangle
        return [ffi.new(ctype + "*", items[i])[0] for i in range(count[0])]
    return [items[i] for i in range(count[0])]


def text(chars) -> str:
    """Decode a fixed-size C char array."""
    _, ffi, _ = load()
    return ffi.string(chars).decode("utf-8", "replace")


class Barrier:
    """A pre-built global VkMemoryBarrier with its stage masks; `record(cb)` is one raw call."""

    def __init__(self, src_stage: int, src_access: int, dst_stage: int, dst_access: int):
        vk, ffi, lib = load()
        self._lib, self._null = lib, ffi.NULL
        self.src_stage, self.dst_stage = src_stage, dst_stage
        self.struct = ffi.new("VkMemoryBarrier*", {
            "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
            "srcAccessMask": src_access, "dstAccessMask": dst_access})

    def record(self, command_buffer) -> None:
        """Record the barrier into `command_buffer`."""
        self._lib.vkCmdPipelineBarrier(command_buffer, self.src_stage, self.dst_stage, 0,
                                       1, self.struct, 0, self._null, 0, self._null)


def full_barrier() -> Barrier:
    """Every earlier write (any stage) before every later access, host reads included.

    Used around one-shot transfers, where clarity beats overlap.
    """
    vk, _, _ = load()
    return Barrier(vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, vk.VK_ACCESS_MEMORY_WRITE_BIT,
                   vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT | vk.VK_PIPELINE_STAGE_HOST_BIT,
                   vk.VK_ACCESS_MEMORY_READ_BIT | vk.VK_ACCESS_MEMORY_WRITE_BIT
                   | vk.VK_ACCESS_HOST_READ_BIT)
