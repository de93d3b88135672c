"""`python -m runtime info`: the device, its capabilities and limits, and which variants run here.

It must not change any state (no compiling, no cache writes beyond what
opening the device does). Called by `runtime.tools.cli`.
"""

from __future__ import annotations

from runtime.errors import EtvkError
from runtime.ops.library import catalog
from runtime.vulkan.device import CAPABILITY_NAMES, get_device


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _capability(caps, name: str) -> str:
    why_not = caps.why_not(name)
    return f"{name} {_yes(caps.supports(name))}" + (f" ({why_not})" if why_not else "")


_MEMORY_FLAGS = ((1, "device-local"), (2, "host-visible"), (4, "host-coherent"), (8, "host-cached"))


def _memory_lines(heaps) -> list[str]:
    lines = []
    for index, (size, types) in enumerate(heaps):
        kinds = sorted({" ".join(name for bit, name in _MEMORY_FLAGS if flags & bit) or "plain"
                        for flags in types})
        lines.append(f"  heap {index}: {size / 2**30:.1f} GiB; types: " + "; ".join(kinds))
    return lines


def describe_device(device) -> list[str]:
    """Lines describing `device`: identity, family, capabilities, limits."""
    caps, limits = device.caps, device.caps.limits
    origin = "overridden by ETVK_GPU_FAMILY" if caps.family_overridden else "detected"
    formats = ("rgba32f", "rgba16f", "rgba32i", "rgba8i", "rgba8ui")
    return [
        f"device: {caps.name} ({caps.device_type})",
        f"  api {caps.api_version}; driver {caps.driver_name} {caps.driver_info} "
        f"(id {caps.driver_id}, version 0x{caps.driver_version:x})",
        f"  vendor 0x{caps.vendor_id:04x}, device 0x{caps.device_id:04x}",
        f"family: {caps.family} ({origin})",
        "capabilities: " + ", ".join(_capability(caps, n) for n in CAPABILITY_NAMES),
        f"  int8 dot product (4x8 packed signed) accelerated: {_yes(caps.dot4x8_signed_accelerated)}; "
        f"subgroup size {caps.subgroup_size} (pipelines: "
        f"{'-'.join(map(str, caps.subgroup_size_range)) or 'unknown'})",
        "storage images: " + ", ".join(f"{f} {_yes(caps.supports_storage_image(f))}" for f in formats),
        "cooperative matrices: " + ("; ".join(map(str, caps.cooperative_matrices)) or "none"),
        f"timestamps: {_yes(caps.timestamps)} (period {caps.timestamp_period} ns)",
        f"pipeline statistics (python -m runtime stats): {_yes(caps.pipeline_statistics)}",
        "limits:",
        f"  max storage buffer range {limits.max_storage_buffer_range}, max allocation "
        f"{limits.max_memory_allocation_size}, max image dimension 3-D {limits.max_image_dimension_3d}, "
        f"2-D {limits.max_image_dimension_2d}",
        f"  max workgroup count {list(limits.max_compute_work_group_count)}, size "
        f"{list(limits.max_compute_work_group_size)}, invocations "
        f"{limits.max_compute_work_group_invocations}, shared memory "
        f"{limits.max_compute_shared_memory_size}",
        f"  max push constants {limits.max_push_constants_size}, min storage buffer offset alignment "
        f"{limits.min_storage_buffer_offset_alignment}",
        "memory:",
        *_memory_lines(device.memory_heaps),
    ]


def describe_variants(libraries, caps) -> list[str]:
    """Lines listing every variant of each library by op, with runnable yes/no and the reason."""
    lines = []
    for library in libraries:
        lines.append(f"variants ({len(library.variants())}, from {library.source()}):")
        for op, entry in sorted(library.ops().items()):
            lines.append(f"  {op}")
            for name in entry["variants"]:
                ok, reason = library.variant(name).runnable(caps)
                lines.append(f"    {name}: " + ("runnable" if ok else f"not runnable: {reason}"))
    return lines


def info() -> int:
    """Print the device and variant report; return the exit status.

    Raises:
        VulkanUnavailable: no Vulkan loader or device.
    """
    device = get_device()
    lines = describe_device(device)
    try:
        lines += describe_variants(catalog().libraries, device.caps)
    except EtvkError as exc:
        lines.append(f"variants: none ({exc})")
    print("\n".join(lines))
    return 0
