"""Query one physical device: properties, features, limits, formats.

`probe_device()` reads everything `Capabilities` reports through pNext chains of
VkPhysicalDeviceProperties2/Features2 (and, where cooperative matrices are
supported, their shapes: coopmat.py); `feature_chain()` builds the chain that
enables exactly the supported optional features at device creation. Under
validation, structs of extensions newer than the layer's header are never
chained (the layer rejects unknown structs): `held_back()` decides; except
those of `GAPS_TOLERATED`, whose messages layer_gaps.py drops instead. It must
not create devices or decide policy (family, device choice): device.py does.
Called by device.py (and `version_tuple` by instance.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.vulkan import raw
from runtime.vulkan.coopmat import query_shapes

# (struct, sType, core since (major, minor) or None, extension, {capability: feature fields});
# a capability is supported when all its fields are, and enabling it sets them all
FEATURE_STRUCTS = (
    ("VkPhysicalDeviceShaderFloat16Int8Features",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES", (1, 2),
     "VK_KHR_shader_float16_int8", {"shader_float16": "shaderFloat16", "shader_int8": "shaderInt8"}),
    ("VkPhysicalDevice8BitStorageFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_8BIT_STORAGE_FEATURES", (1, 2),
     "VK_KHR_8bit_storage", {"storage_buffer_8bit": "storageBuffer8BitAccess"}),
    ("VkPhysicalDevice16BitStorageFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES", (1, 1),
     "VK_KHR_16bit_storage", {"storage_buffer_16bit": "storageBuffer16BitAccess"}),
    ("VkPhysicalDeviceShaderIntegerDotProductFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES", (1, 3),
     "VK_KHR_shader_integer_dot_product", {"integer_dot_product": "shaderIntegerDotProduct"}),
    ("VkPhysicalDeviceVulkanMemoryModelFeatures",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES", (1, 2),
     "VK_KHR_vulkan_memory_model",
     # device scope too: with the model on, the layer rejects Device-scope atomics without it
     {"vulkan_memory_model": ("vulkanMemoryModel", "vulkanMemoryModelDeviceScope")}),
    # LocalSizeId (what glslang emits for spec-constant workgroup sizes when targeting Vulkan
    # 1.3, as for the cooperative-matrix shaders) needs maintenance4 enabled
    ("VkPhysicalDeviceMaintenance4Features",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES", (1, 3),
     "VK_KHR_maintenance4", {"maintenance4": "maintenance4"}),
    ("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR", None,
     "VK_KHR_cooperative_matrix", {"cooperative_matrix": "cooperativeMatrix"}),
    # the compiler's statistics of a pipeline (registers, shared memory): runtime/vulkan/statistics.py;
    # a tool's feature, not one a shader may require (Capabilities.pipeline_statistics)
    ("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
     "VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR", None,
     "VK_KHR_pipeline_executable_properties", {"pipeline_statistics": "pipelineExecutableInfo"}),
)

# extension -> the Vulkan header version that introduced it (a layer built from an older
# header rejects its structs); for every FEATURE_STRUCTS extension newer than 1.2.140
EXTENSION_HEADERS = {
    "VK_KHR_shader_integer_dot_product": (1, 2, 175),
    "VK_KHR_maintenance4": (1, 2, 191),
    "VK_KHR_cooperative_matrix": (1, 3, 255),
}

# extensions chained even under a layer that predates them (runtime/vulkan/layer_gaps.py drops
# what that layer says about them), so their shaders stay testable under validation
GAPS_TOLERATED = ("VK_KHR_cooperative_matrix",)

# storage-image format name -> VkFormat constant name
IMAGE_FORMATS = {
    "rgba32f": "VK_FORMAT_R32G32B32A32_SFLOAT",
    "rgba16f": "VK_FORMAT_R16G16B16A16_SFLOAT",
    "rgba32i": "VK_FORMAT_R32G32B32A32_SINT",
    "rgba8i": "VK_FORMAT_R8G8B8A8_SINT",
    "rgba8ui": "VK_FORMAT_R8G8B8A8_UINT",
}


@dataclass(frozen=True)
class Probe:
    """Raw facts about one physical device, before policy is applied."""

    properties: dict
    limits: dict
    features: frozenset
    held_back: dict  # capability -> why it is not in `features` although the device has it
    extensions: tuple  # device extensions to enable for `features`
    storage_image_formats: frozenset
    queue_family: int
    timestamp_valid_bits: int
    coop_shapes: tuple = ()  # CoopMatrixShape of every cooperative-matrix property


def version_tuple(version: int) -> tuple[int, int, int]:
    """Split a packed Vulkan version into (major, minor, patch)."""
    return (version >> 22) & 0x7F, (version >> 12) & 0x3FF, version & 0xFFF


def held_back(available: dict[str, tuple], layer_version: tuple | None) -> dict[str, str]:
    """Capabilities whose feature struct the validation layer predates, with the reason.

    Args:
        available: extension -> capabilities the device could enable through
            its feature struct (core or extension).
        layer_version: the validation layer's (major, minor, patch), or None
            without validation.

    Returns:
        capability -> e.g. "the validation layer, header 170, predates
        VK_KHR_shader_integer_dot_product", for every extension of
        `EXTENSION_HEADERS` newer than `layer_version` but not in `GAPS_TOLERATED`.
    """
    if layer_version is None:
        return {}
    return {cap: f"the validation layer, header {layer_version[2]}, predates {extension}"
            for extension, caps in available.items()
            if tuple(layer_version) < EXTENSION_HEADERS.get(extension, (0, 0, 0))
            and extension not in GAPS_TOLERATED for cap in caps}


def _usable_structs(api: tuple[int, int], extensions: set[str]):
    """(ctype, sType, extension, whether it must be enabled, fields) of each struct the device has."""
    vk, ffi, _ = raw.load()
    for ctype, stype, core, extension, fields in FEATURE_STRUCTS:
        try:
            ffi.typeof(ctype)
        except ffi.error:  # the binding does not know it: report unsupported
            continue
        if (core is not None and api >= core) or extension in extensions:
            yield ctype, getattr(vk, stype), extension, core is None or api < core, fields


def _names(fields) -> tuple:
    """The feature field names of one capability (one name or a tuple of them)."""
    return (fields,) if isinstance(fields, str) else tuple(fields)


def _chain(structs, features=None):
    """Link feature structs behind a VkPhysicalDeviceFeatures2; return (head, keepalive)."""
    vk, ffi, _ = raw.load()
    keep, next_ptr = [], ffi.NULL
    for ctype, stype, _, _, fields in structs:
        values = {f: 1 for c, names in fields.items() if features is not None and c in features
                  for f in _names(names)}
        node = ffi.new(ctype + "*", {"sType": stype, "pNext": next_ptr, **values})
        keep.append(node)
        next_ptr = node
    head = ffi.new("VkPhysicalDeviceFeatures2*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, "pNext": next_ptr})
    return head, keep


def probe_device(instance, physical, layer_version: tuple | None = None) -> Probe:
    """Query `physical` (a VkPhysicalDevice) for everything the runtime reports.

    Args:
        instance: its VkInstance (for extension entry points).
        physical: the VkPhysicalDevice.
        layer_version: the validation layer's (major, minor, patch), or None:
            capabilities it predates are `held_back`, never queried nor enabled.
    """
    vk, ffi, lib = raw.load()
    base = ffi.new("VkPhysicalDeviceProperties*")
    lib.vkGetPhysicalDeviceProperties(physical, base)
    api = version_tuple(base.apiVersion)[:2]
    extensions = {raw.text(e.extensionName) for e in raw.enumerate_items(
        "VkExtensionProperties", lib.vkEnumerateDeviceExtensionProperties, physical, ffi.NULL)}

    driver = ffi.new("VkPhysicalDeviceDriverProperties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES})
    subgroup = ffi.new("VkPhysicalDeviceSubgroupProperties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, "pNext": driver})
    maint3 = ffi.new("VkPhysicalDeviceMaintenance3Properties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, "pNext": subgroup})
    dot = ffi.new("VkPhysicalDeviceShaderIntegerDotProductProperties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES,
        "pNext": maint3})
    has_dot = api >= (1, 3) or "VK_KHR_shader_integer_dot_product" in extensions
    has_driver = api >= (1, 2) or "VK_KHR_driver_properties" in extensions
    has_sizes = api >= (1, 3)  # VkPhysicalDeviceSubgroupSizeControlProperties is core there
    sizes = ffi.new("VkPhysicalDeviceSubgroupSizeControlProperties*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES,
        "pNext": dot if has_dot else maint3})
    props2 = ffi.new("VkPhysicalDeviceProperties2*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
        "pNext": sizes if has_sizes else dot if has_dot else maint3})
    if not has_driver:
        subgroup.pNext = ffi.NULL
    lib.vkGetPhysicalDeviceProperties2(physical, props2)
    p, lim = props2.properties, props2.properties.limits

    structs = list(_usable_structs(api, extensions))
    held = held_back({s[2]: tuple(s[4]) for s in structs}, layer_version)
    structs = [s for s in structs if not set(s[4]) & set(held)]
    features2, keep = _chain(structs)
    lib.vkGetPhysicalDeviceFeatures2(physical, features2)
    supported = {cap for node, (_, _, _, _, fields) in zip(keep, structs, strict=True)
                 for cap, names in fields.items() if all(getattr(node, f) for f in _names(names))}
    if features2.features.shaderInt16:
        supported.add("shader_int16")
    compute = bool(subgroup.supportedStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
    for cap, bit in (("subgroup_arithmetic", vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
                     ("subgroup_shuffle", vk.VK_SUBGROUP_FEATURE_SHUFFLE_BIT)):
        if compute and subgroup.supportedOperations & bit:
            supported.add(cap)
    needed_ext = tuple(sorted({ext for _, _, ext, needed, fields in structs
                               if needed and supported & set(fields)}))

    formats = set()
    for name, const in IMAGE_FORMATS.items():
        fp = ffi.new("VkFormatProperties*")
        lib.vkGetPhysicalDeviceFormatProperties(physical, getattr(vk, const), fp)
        if fp.optimalTilingFeatures & vk.VK_FORMAT_FEATURE_STORAGE_IMAGE_BIT:
            formats.add(name)

    families = raw.enumerate_items(
        "VkQueueFamilyProperties", lib.vkGetPhysicalDeviceQueueFamilyProperties, physical)
    compute_families = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
    queue_family = compute_families[0] if compute_families else -1

    return Probe(
        properties={
            "name": raw.text(p.deviceName), "vendor_id": p.vendorID, "device_id": p.deviceID,
            "device_type": p.deviceType, "api_version": base.apiVersion,
            "driver_version": p.driverVersion,
            "driver_id": driver.driverID if has_driver else 0,
            "driver_name": raw.text(driver.driverName) if has_driver else "",
            "driver_info": raw.text(driver.driverInfo) if has_driver else "",
            "pipeline_cache_uuid": bytes(ffi.buffer(p.pipelineCacheUUID)),
            "subgroup_size": subgroup.subgroupSize,
            # (min, max) a pipeline may run with (SPIR-V 1.6 shaders may vary), () if unknown
            "subgroup_size_range": (sizes.minSubgroupSize, sizes.maxSubgroupSize) if has_sizes
            else (),
            "dot4x8_signed_accelerated": bool(
                has_dot and dot.integerDotProduct4x8BitPackedSignedAccelerated),
            "timestamp_period": lim.timestampPeriod,
        },
        limits={
            "max_storage_buffer_range": lim.maxStorageBufferRange,
            "max_memory_allocation_size": maint3.maxMemoryAllocationSize,
            "max_compute_work_group_count": tuple(lim.maxComputeWorkGroupCount),
            "max_compute_work_group_size": tuple(lim.maxComputeWorkGroupSize),
            "max_compute_work_group_invocations": lim.maxComputeWorkGroupInvocations,
            "max_compute_shared_memory_size": lim.maxComputeSharedMemorySize,
            "max_image_dimension_3d": lim.maxImageDimension3D,
            "max_image_dimension_2d": lim.maxImageDimension2D,
            "max_push_constants_size": lim.maxPushConstantsSize,
            "min_storage_buffer_offset_alignment": lim.minStorageBufferOffsetAlignment,
        },
        features=frozenset(supported),
        held_back=held,
        extensions=needed_ext,
        storage_image_formats=frozenset(formats),
        queue_family=queue_family,
        timestamp_valid_bits=families[queue_family].timestampValidBits if compute_families else 0,
        coop_shapes=query_shapes(instance, physical) if "cooperative_matrix" in supported else (),
    )


def feature_chain(physical, features: frozenset, robust: bool = False):
    """Build a VkPhysicalDeviceFeatures2 chain enabling exactly `features`, and
    robustBufferAccess when `robust` and the device has it.

    Returns:
        (head pointer, keepalive list): keep both alive until vkCreateDevice returns.
    """
    _, ffi, lib = raw.load()
    base = ffi.new("VkPhysicalDeviceProperties*")
    lib.vkGetPhysicalDeviceProperties(physical, base)
    extensions = {raw.text(e.extensionName) for e in raw.enumerate_items(
        "VkExtensionProperties", lib.vkEnumerateDeviceExtensionProperties, physical, ffi.NULL)}
    structs = [s for s in _usable_structs(version_tuple(base.apiVersion)[:2], extensions)
               if features & set(s[4])]
    head, keep = _chain(structs, features)
    head.features.shaderInt16 = "shader_int16" in features
    if robust:
        supported = ffi.new("VkPhysicalDeviceFeatures*")
        lib.vkGetPhysicalDeviceFeatures(physical, supported)
        head.features.robustBufferAccess = supported.robustBufferAccess
    return head, keep
