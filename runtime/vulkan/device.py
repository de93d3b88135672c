"""The Vulkan device: instance, physical-device choice, logical device, queue.

Owns every Vulkan object of the process through a registry of live objects
and destroys them all, in reverse order, on `close()` (also at exit), so the
validation layer reports no leak. Keeps idle objects for reuse: memory in a
bounded `Recycler` (`spare_memory`, for memory.py), recorded command buffers
in `Recordings` (`recordings`, for stream.py).
Decides the GPU family and the capability vocabulary; enables optional
features only where supported (and, under validation, only where the layer
knows their structs, or where layer_gaps.py tolerates what it says about them). It must not know about shaders, tensors or ops.
`get_device()` is called by tensor.py, stream.py, the registry and
`python -m runtime info`.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from dataclasses import dataclass, field

from runtime.errors import NO_DEVICE, DeviceClosed, EtvkError, VulkanUnavailable
from runtime.vulkan import raw
from runtime.vulkan.coopmat import COOPMAT_CAPABILITIES, coopmat_gap
from runtime.vulkan.instance import SEVERITIES, create_instance, destroy_instance
from runtime.vulkan.layer_gaps import LayerGaps
from runtime.vulkan.pipeline import PipelineCache
from runtime.vulkan.probe import feature_chain, probe_device, version_tuple
from runtime.vulkan.recordings import Recordings
from runtime.vulkan.recycler import Recycler

CAPABILITY_NAMES = (
    "shader_int8", "shader_float16", "shader_int16", "storage_buffer_8bit",
    "storage_buffer_16bit", "integer_dot_product", "cooperative_matrix", "vulkan_memory_model",
    "maintenance4", "subgroup_arithmetic", "subgroup_shuffle", *COOPMAT_CAPABILITIES,
)
GPU_FAMILIES = ("mali", "adreno", "nvidia", "amd", "intel", "powervr", "llvmpipe",
                "swiftshader", "other")
VENDOR_FAMILIES = {0x13B5: "mali", 0x5143: "adreno", 0x10DE: "nvidia", 0x1002: "amd",
                   0x1022: "amd", 0x8086: "intel", 0x1010: "powervr"}
DRIVER_FAMILIES = {13: "llvmpipe", 10: "swiftshader"}  # VkDriverId: MESA_LLVMPIPE, GOOGLE_SWIFTSHADER
DEVICE_TYPES = {0: "other", 1: "integrated_gpu", 2: "discrete_gpu", 3: "virtual_gpu", 4: "cpu"}
TYPE_PREFERENCE = ("discrete_gpu", "integrated_gpu", "virtual_gpu", "cpu", "other")
SPARE_MEMORY_BYTES, SPARE_MEMORY_ENTRIES = 256 << 20, 64
RECORDINGS = 32  # idle recorded command buffers kept for streams of the same dispatches
# Microseconds a stream polls its fence before blocking in vkWaitForFences (ETVK_FENCE_SPIN_US):
# waking a blocked thread costs tens of microseconds, a small dispatch takes a few. Not on CPU
# drivers, whose own threads need the cores.
FENCE_SPIN_US = 200


class ConfigError(EtvkError, ValueError):
    """A bad ETVK_* environment setting."""


def gpu_family(vendor_id: int, driver_id: int, override: str | None = None) -> str:
    """Map a device to its GPU family.

    Args:
        vendor_id: VkPhysicalDeviceProperties.vendorID.
        driver_id: VkPhysicalDeviceDriverProperties.driverID (0 if unknown).
        override: a family name that wins (ETVK_GPU_FAMILY), or None/"".

    Returns:
        One of `GPU_FAMILIES`.

    Raises:
        ConfigError: `override` is not a known family.
    """
    if override:
        if override not in GPU_FAMILIES:
            raise ConfigError(f"ETVK_GPU_FAMILY={override!r} is not a GPU family; "
                              f"use one of: {', '.join(GPU_FAMILIES)}")
        return override
    return DRIVER_FAMILIES.get(driver_id) or VENDOR_FAMILIES.get(vendor_id, "other")


def fence_spin_seconds(setting: str | None, device_type: str) -> float:
    """Seconds to poll a fence before blocking: `setting` (ETVK_FENCE_SPIN_US, microseconds) or
    `FENCE_SPIN_US` (0 on a CPU device).

    Raises:
        ConfigError: `setting` is not a whole number >= 0.
    """
    if setting is None or setting == "":
        return 0.0 if device_type == "cpu" else FENCE_SPIN_US * 1e-6
    if not setting.strip().isdigit():
        raise ConfigError(f"ETVK_FENCE_SPIN_US={setting!r} is not a whole number of microseconds >= 0")
    return int(setting) * 1e-6


def reuse_recordings(setting: str | None) -> bool:
    """Whether streams reuse a kept recording of the same dispatches: `setting`
    (ETVK_REUSE_RECORDINGS, "0" or "1"; default on).

    Raises:
        ConfigError: another value.
    """
    if setting is None or setting == "":
        return True
    if setting not in ("0", "1"):
        raise ConfigError(f"ETVK_REUSE_RECORDINGS={setting!r} must be 0 (record every stream afresh) or 1")
    return setting == "1"


def choose_physical_device(candidates: list[tuple[str, str]], selector: str | None) -> int:
    """Pick a device index from `[(name, device_type), ...]`.

    Args:
        candidates: name and type (a `DEVICE_TYPES` value) of each device, in
            enumeration order.
        selector: ETVK_DEVICE: an index, or a case-insensitive name substring;
            None/"" picks by type (discrete > integrated > virtual > CPU > other).

    Returns:
        The chosen index.

    Raises:
        ConfigError: the selector matches no device.
    """
    listing = "; ".join(f"{i}: {name}" for i, (name, _) in enumerate(candidates))
    if selector:
        if selector.strip().isdigit():
            if int(selector) < len(candidates):
                return int(selector)
        else:
            for i, (name, _) in enumerate(candidates):
                if selector.lower() in name.lower():
                    return i
        raise ConfigError(f"ETVK_DEVICE={selector!r} matches no Vulkan device; devices: {listing}")
    return min(range(len(candidates)), key=lambda i: TYPE_PREFERENCE.index(candidates[i][1]))


@dataclass(frozen=True)
class Limits:
    """Device limits the runtime checks against (bytes, counts)."""

    max_storage_buffer_range: int
    max_memory_allocation_size: int
    max_compute_work_group_count: tuple
    max_compute_work_group_size: tuple
    max_compute_work_group_invocations: int
    max_compute_shared_memory_size: int
    max_image_dimension_3d: int
    max_image_dimension_2d: int
    max_push_constants_size: int
    min_storage_buffer_offset_alignment: int


@dataclass(frozen=True)
class Capabilities:
    """What the chosen device is and can do; `supports()` speaks `CAPABILITY_NAMES`."""

    name: str
    vendor_id: int
    device_id: int
    device_type: str
    api_version: str
    driver_id: int
    driver_name: str
    driver_info: str
    driver_version: int
    family: str
    family_overridden: bool
    features: frozenset
    dot4x8_signed_accelerated: bool
    subgroup_size: int
    limits: Limits
    timestamp_period: float
    timestamps: bool
    storage_image_formats: frozenset
    pipeline_cache_uuid: bytes
    held_back: tuple = field(default=())  # ((capability, why it is not enabled), ...)
    cooperative_matrices: tuple = field(default=())  # runtime.vulkan.coopmat.CoopMatrixShape
    subgroup_size_range: tuple = field(default=())  # (min, max) subgroup size, () if unknown
    # VK_KHR_pipeline_executable_properties enabled: runtime/vulkan/statistics.py can report
    # what the compiler made of a pipeline (a tool's feature, not one a shader may require)
    pipeline_statistics: bool = False

    def supports(self, name: str) -> bool:
        """Whether capability `name` (one of `CAPABILITY_NAMES`) is enabled.

        A cooperative-matrix capability (`COOPMAT_CAPABILITIES`) needs
        cooperative_matrix enabled, Vulkan >= 1.3, the exact shape, types and
        scope among `cooperative_matrices`, and the subgroup size it names as the only
        size a pipeline may get.

        Raises:
            ValueError: `name` is not a capability name.
        """
        if name not in CAPABILITY_NAMES:
            raise ValueError(f"unknown capability {name!r}; use one of: {', '.join(CAPABILITY_NAMES)}")
        if name in COOPMAT_CAPABILITIES:
            return not self._coopmat_gap(name)
        return name in self.features

    def why_not(self, name: str) -> str:
        """Why capability `name` is not enabled, or "" when it is or no reason is known.

        E.g. "the validation layer, header 239, predates VK_KHR_cooperative_matrix", or
        for a cooperative-matrix capability "no cooperative matrix 16x16x32 s8 x s8 + s32
        -> s32 (subgroup)".
        """
        if name in COOPMAT_CAPABILITIES:
            return dict(self.held_back).get("cooperative_matrix", "") or self._coopmat_gap(name)
        return dict(self.held_back).get(name, "")

    def _coopmat_gap(self, name: str) -> str:
        api = tuple(int(v) for v in self.api_version.split(".")[:2])
        return coopmat_gap(name, self.features, self.cooperative_matrices, self.subgroup_size,
                           self.subgroup_size_range, api)

    def supports_storage_image(self, fmt: str) -> bool:
        """Whether storage images of `fmt` (rgba32f, rgba16f, rgba32i, rgba8i, rgba8ui) work."""
        return fmt in self.storage_image_formats


def _close_if_alive(ref) -> None:
    device = ref()
    if device is not None:
        device.close()


class Device:
    """One logical device with one compute queue and a command pool.

    Args:
        selector: device index or name substring; default `ETVK_DEVICE`.
        validation: enable the Khronos validation layer (with synchronization
            validation); default `ETVK_VALIDATION == "1"`.

    Raises:
        VulkanUnavailable: no loader, no device, or validation asked for
            without the layer installed.
        ConfigError: bad ETVK_DEVICE / ETVK_GPU_FAMILY / ETVK_REUSE_RECORDINGS.
    """

    def __init__(self, selector: str | None = None, validation: bool | None = None):
        if selector is None:
            selector = os.environ.get("ETVK_DEVICE")
        if validation is None:
            validation = os.environ.get("ETVK_VALIDATION") == "1"
        self.validation = validation
        self.closed = False
        # Held by whoever records or submits through this device's shared objects (command
        # pool, queue, caches) from a public entry point: op calls and loaded programs.
        self.lock = threading.RLock()
        self._live: list[weakref.finalize] = []
        self._prune_at = 64
        self.recordings = Recordings(RECORDINGS, reuse_recordings(os.environ.get("ETVK_REUSE_RECORDINGS")))
        # Kept recordings that bind an allocation go before the allocation does: no descriptor
        # set of a live pool ever names a destroyed buffer or view.
        self.spare_memory = Recycler(SPARE_MEMORY_ENTRIES, SPARE_MEMORY_BYTES,
                                     retire=self.recordings.forget)
        self._messages: list[tuple[int, str]] = []
        self.layer_gaps = LayerGaps()  # messages of an outdated layer that are not errors
        self._message_handle = None  # keeps the validation callback's user data alive
        self.instance = self.messenger = self.handle = self.command_pool = self.pipelines = None
        self._once_fence = None
        raw.load()
        try:
            self.instance, self.messenger, layer = create_instance(self.validation, self)
            self.layer_gaps.layer_version = layer
            physical = self._choose(selector)
            self._create_device(physical, layer)
            self.pipelines = PipelineCache(self)
        except BaseException:
            self.close()
            raise
        atexit.register(_close_if_alive, weakref.ref(self))

    # -- creation ---------------------------------------------------------------

    def _choose(self, selector: str | None):
        vk, ffi, lib = raw.load()
        physicals = raw.enumerate_items("VkPhysicalDevice", lib.vkEnumeratePhysicalDevices,
                                        self.instance)
        if not physicals:
            raise VulkanUnavailable(NO_DEVICE)
        candidates = []
        for physical in physicals:
            props = ffi.new("VkPhysicalDeviceProperties*")
            lib.vkGetPhysicalDeviceProperties(physical, props)
            candidates.append((raw.text(props.deviceName), DEVICE_TYPES.get(props.deviceType, "other")))
        return physicals[choose_physical_device(candidates, selector)]

    def _create_device(self, physical, layer_version) -> None:
        vk, ffi, lib = raw.load()
        probe = probe_device(self.instance, physical, layer_version)
        props = probe.properties
        if probe.queue_family < 0 or version_tuple(props["api_version"])[:2] < (1, 1):
            raise VulkanUnavailable(f"Vulkan device {props['name']!r} needs Vulkan >= 1.1 and a "
                                    "compute queue: install a newer driver")
        override = os.environ.get("ETVK_GPU_FAMILY", "")
        self.caps = Capabilities(
            name=props["name"], vendor_id=props["vendor_id"], device_id=props["device_id"],
            device_type=DEVICE_TYPES.get(props["device_type"], "other"),
            api_version=".".join(map(str, version_tuple(props["api_version"]))),
            driver_id=props["driver_id"], driver_name=props["driver_name"],
            driver_info=props["driver_info"], driver_version=props["driver_version"],
            family=gpu_family(props["vendor_id"], props["driver_id"], override),
            family_overridden=bool(override), features=probe.features - {"pipeline_statistics"},
            dot4x8_signed_accelerated=props["dot4x8_signed_accelerated"],
            subgroup_size=props["subgroup_size"], limits=Limits(**probe.limits),
            timestamp_period=props["timestamp_period"],
            timestamps=probe.timestamp_valid_bits > 0,
            storage_image_formats=probe.storage_image_formats,
            pipeline_cache_uuid=props["pipeline_cache_uuid"],
            held_back=tuple(sorted(probe.held_back.items())),
            cooperative_matrices=probe.coop_shapes,
            subgroup_size_range=props["subgroup_size_range"],
            pipeline_statistics="pipeline_statistics" in probe.features)
        self.timestamp_valid_bits = probe.timestamp_valid_bits
        self.fence_spin = fence_spin_seconds(os.environ.get("ETVK_FENCE_SPIN_US"),
                                             self.caps.device_type)
        self.queue_family = probe.queue_family
        self.physical = physical
        memory = ffi.new("VkPhysicalDeviceMemoryProperties*")
        lib.vkGetPhysicalDeviceMemoryProperties(physical, memory)
        self.memory_types = [memory.memoryTypes[i].propertyFlags for i in range(memory.memoryTypeCount)]
        # (heap size in bytes, property flags of the types in that heap), for `info`
        self.memory_heaps = [
            (memory.memoryHeaps[h].size,
             [memory.memoryTypes[i].propertyFlags for i in range(memory.memoryTypeCount)
              if memory.memoryTypes[i].heapIndex == h])
            for h in range(memory.memoryHeapCount)]

        # On a CPU device, device memory is this process's own memory: bounds-checked buffer
        # access keeps a shader's out-of-range write from damaging its heap.
        features, keep = feature_chain(physical, probe.features, robust=self.caps.device_type == "cpu")
        self.robust_buffer_access = bool(features.features.robustBufferAccess)
        priority = ffi.new("float[]", [1.0])
        queue_info = ffi.new("VkDeviceQueueCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
            "queueFamilyIndex": self.queue_family, "queueCount": 1, "pQueuePriorities": priority})
        ext_arrays = [ffi.new("char[]", e.encode()) for e in probe.extensions]
        ext_names = ffi.new("char*[]", ext_arrays)
        info = ffi.new("VkDeviceCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, "pNext": features,
            "queueCreateInfoCount": 1, "pQueueCreateInfos": queue_info,
            "enabledExtensionCount": len(ext_arrays), "ppEnabledExtensionNames": ext_names})
        out = ffi.new("VkDevice*")
        raw.check(lib.vkCreateDevice(physical, info, ffi.NULL, out), "vkCreateDevice")
        self.handle = out[0]
        queue = ffi.new("VkQueue*")
        lib.vkGetDeviceQueue(self.handle, self.queue_family, 0, queue)
        self.queue = queue[0]
        pool_info = ffi.new("VkCommandPoolCreateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
            "flags": vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
            "queueFamilyIndex": self.queue_family})
        pool = ffi.new("VkCommandPool*")
        raw.check(lib.vkCreateCommandPool(self.handle, pool_info, ffi.NULL, pool), "vkCreateCommandPool")
        self.command_pool = pool[0]
        self._once_fence = self.create_fence()

    # -- services for memory.py / pipeline.py / stream.py ------------------------

    def track(self, owner: object, destroy, *args) -> weakref.finalize:
        """Call `destroy(*args)` when `owner` is collected or at `close()`, whichever is first.

        `args` must not reference `owner`. Objects are destroyed in reverse
        order of tracking at close.
        """
        if len(self._live) > self._prune_at:
            self._live = [f for f in self._live if f.alive]
            self._prune_at = max(64, 2 * len(self._live))
        finalizer = weakref.finalize(owner, destroy, *args)
        finalizer.atexit = False  # close() (itself at exit) destroys in order
        self._live.append(finalizer)
        return finalizer

    def require_open(self) -> None:
        """Raise `DeviceClosed` if `close()` already destroyed this device's objects."""
        if self.closed:
            raise DeviceClosed(f"the Vulkan device {self.caps.name!r} was closed; its tensors and "
                               "streams are gone")

    def create_fence(self):
        """Create an unsignalled VkFence owned by the caller."""
        vk, ffi, lib = raw.load()
        info = ffi.new("VkFenceCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_FENCE_CREATE_INFO})
        fence = ffi.new("VkFence*")
        raw.check(lib.vkCreateFence(self.handle, info, ffi.NULL, fence), "vkCreateFence")
        return fence[0]

    def submit_and_wait(self, command_buffers, fence, what: str) -> None:
        """Submit `command_buffers` (a cffi VkCommandBuffer[]) and wait for `fence`.

        Raises:
            VulkanError: the submission or the wait failed (e.g. device lost).
        """
        vk, ffi, lib = raw.load()
        submit = ffi.new("VkSubmitInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, "commandBufferCount": len(command_buffers),
            "pCommandBuffers": command_buffers})
        fences = ffi.new("VkFence[]", [fence])
        raw.check(lib.vkQueueSubmit(self.queue, 1, submit, fence), f"vkQueueSubmit ({what})")
        raw.check(lib.vkWaitForFences(self.handle, 1, fences, 1, 2**64 - 1), f"vkWaitForFences ({what})")
        raw.check(lib.vkResetFences(self.handle, 1, fences), "vkResetFences")

    def run_once(self, record, what: str) -> None:
        """Record commands with `record(command_buffer)`, submit them and wait."""
        self.require_open()
        vk, ffi, lib = raw.load()
        alloc = ffi.new("VkCommandBufferAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
            "commandPool": self.command_pool, "level": vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
            "commandBufferCount": 1})
        cbs = ffi.new("VkCommandBuffer[]", 1)
        raw.check(lib.vkAllocateCommandBuffers(self.handle, alloc, cbs), "vkAllocateCommandBuffers")
        try:
            begin = ffi.new("VkCommandBufferBeginInfo*", {
                "sType": vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                "flags": vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT})
            raw.check(lib.vkBeginCommandBuffer(cbs[0], begin), "vkBeginCommandBuffer")
            record(cbs[0])
            raw.check(lib.vkEndCommandBuffer(cbs[0]), "vkEndCommandBuffer")
            self.submit_and_wait(cbs, self._once_fence, what)
        finally:
            lib.vkFreeCommandBuffers(self.handle, self.command_pool, 1, cbs)

    def record_message(self, severity: int, text: str) -> None:
        """Collect one validation message, unless `layer_gaps` tolerates it (instance.py's callback)."""
        if not self.layer_gaps.tolerated(text):
            self._messages.append((severity, text))

    def take_validation_messages(self, min_severity: str = "error") -> list[str]:
        """Drain the validation messages collected so far.

        Args:
            min_severity: "verbose", "info", "warning" or "error".

        Returns:
            The texts of the drained messages at or above `min_severity`.
        """
        threshold = SEVERITIES[min_severity]
        messages, self._messages = self._messages, []
        return [text for severity, text in messages if severity >= threshold]

    def close(self) -> None:
        """Destroy every Vulkan object of this device in reverse order; idempotent."""
        if self.closed:
            return
        self.closed = True
        _, ffi, lib = raw.load()
        if self.handle is not None:
            lib.vkDeviceWaitIdle(self.handle)
            self.recordings.close()
            self.spare_memory.close()
            for finalizer in reversed(self._live):
                finalizer()
            self._live.clear()
            if self.pipelines is not None:
                self.pipelines.close()
            if self._once_fence is not None:
                lib.vkDestroyFence(self.handle, self._once_fence, ffi.NULL)
            if self.command_pool is not None:
                lib.vkDestroyCommandPool(self.handle, self.command_pool, ffi.NULL)
            lib.vkDestroyDevice(self.handle, ffi.NULL)
        if self.instance is not None:
            destroy_instance(self.instance, self.messenger)


_device: Device | None = None


def get_device() -> Device:
    """Return the process-wide device, creating it on first use (or after it was closed).

    Raises:
        VulkanUnavailable: no Vulkan loader or device.
    """
    global _device
    if _device is None or _device.closed:
        _device = Device()
    return _device


def current_device() -> Device | None:
    """The process-wide device if one is open, without creating one."""
    return _device if _device is not None and not _device.closed else None
