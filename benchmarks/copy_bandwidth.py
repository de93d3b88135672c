"""The device's copy bandwidth: vkCmdCopyBuffer of a large device-local buffer, timed by timestamps.

The yardstick of the benchmark report: what the memory system gives a plain
copy, counting bytes read + written as the kernel rows do. One command
buffer holds `copies` copies (a transfer barrier between them), each
bracketed by timestamps; the median copy is taken after ~`warmup` seconds of
such submissions (benchmarks/NOTES.md: idle GPUs drop their clocks). Called
by runtime_bench.py; raw Vulkan calls, as the runtime's own layer makes them.
"""

from __future__ import annotations

import statistics

from timing import warm

from runtime.vulkan import raw
from runtime.vulkan.memory import Buffer


def copy_seconds(device, nbytes: int, warmup: float, repeats: int, copies: int = 8) -> float | None:
    """Median seconds of one `nbytes` device-to-device copy over `repeats` submissions of
    `copies` copies; None without timestamp queries."""
    if not device.caps.timestamps:
        return None
    vk, ffi, lib = raw.load()
    source, destination = Buffer(device, nbytes, "device"), Buffer(device, nbytes, "device")
    source.zero()
    info = raw.new("VkQueryPoolCreateInfo", sType=vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                   queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=2 * copies)
    out = ffi.new("VkQueryPool*")
    raw.check(lib.vkCreateQueryPool(device.handle, info, ffi.NULL, out), "vkCreateQueryPool")
    pool = out[0]
    region = raw.new("VkBufferCopy", size=nbytes)
    transfer = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
    between = raw.Barrier(transfer, vk.VK_ACCESS_TRANSFER_WRITE_BIT, transfer,
                          vk.VK_ACCESS_TRANSFER_WRITE_BIT)

    def record(cb):
        lib.vkCmdResetQueryPool(cb, pool, 0, 2 * copies)
        for i in range(copies):
            if i:
                between.record(cb)
            lib.vkCmdWriteTimestamp(cb, transfer, pool, 2 * i)
            lib.vkCmdCopyBuffer(cb, source.handle, destination.handle, 1, region)
            lib.vkCmdWriteTimestamp(cb, transfer, pool, 2 * i + 1)

    def submit():
        device.run_once(record, "copy bandwidth")

    bits = device.timestamp_valid_bits
    mask = (1 << bits) - 1 if bits < 64 else -1
    period = device.caps.timestamp_period * 1e-9
    stamps = ffi.new("uint64_t[]", 2 * copies)
    flags = vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT
    samples = []
    try:
        warm(submit, warmup)
        for _ in range(repeats):
            submit()
            raw.check(lib.vkGetQueryPoolResults(device.handle, pool, 0, 2 * copies, 16 * copies,
                                                stamps, 8, flags), "vkGetQueryPoolResults")
            samples += [((stamps[2 * i + 1] - stamps[2 * i]) & mask) * period for i in range(copies)]
    finally:
        lib.vkDestroyQueryPool(device.handle, pool, ffi.NULL)
    return statistics.median(samples)
