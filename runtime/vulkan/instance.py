"""The VkInstance, optionally with the Khronos validation layer and a messenger.

With validation on, the instance enables VK_LAYER_KHRONOS_validation with
synchronization validation and a VK_EXT_debug_utils messenger (also chained
into instance creation, so creation and destruction are covered). The
`vulkan` binding allows one Python debug callback per process, so there is
one raw `ffi.callback` here; its user data is a handle to the device, whose
`record_message` collects `(severity, text)`. It also reports the layer's
header version, which decides what device.py may chain into device creation.
It must not pick or create devices. Called only by device.py.
"""

from __future__ import annotations

from runtime.errors import NO_DEVICE, VulkanUnavailable
from runtime.vulkan import raw
from runtime.vulkan.probe import version_tuple

SEVERITIES = {"verbose": 0x1, "info": 0x10, "warning": 0x100, "error": 0x1000}
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"

_callback = None  # the one ffi callback of the process


def _debug_callback():
    global _callback
    if _callback is None:
        _, ffi, _ = raw.load()

        @ffi.callback("PFN_vkDebugUtilsMessengerCallbackEXT")
        def on_message(severity, _types, data, user_data):
            text = ffi.string(data.pMessage).decode("utf-8", "replace")
            ffi.from_handle(user_data).record_message(severity, text)
            return 0

        _callback = on_message
    return _callback


def create_instance(validation: bool, device):
    """Create the instance (and the messenger when `validation`).

    Args:
        validation: enable the validation layer with synchronization validation.
        device: the `Device` whose `_messages` collects validation messages; it
            keeps the cffi handle alive as `device._message_handle`.

    Returns:
        (VkInstance, VkDebugUtilsMessengerEXT or None, the validation layer's
        specVersion as (major, minor, patch) or None).

    Raises:
        VulkanUnavailable: no driver, or validation without the layer installed.
    """
    vk, ffi, lib = raw.load()
    keep = []

    def strings(names):
        arrays = [ffi.new("char[]", n.encode()) for n in names]
        keep.extend(arrays)
        return ffi.new("char*[]", arrays), len(names)

    app_name = ffi.new("char[]", b"etvk")
    app = ffi.new("VkApplicationInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_APPLICATION_INFO, "pApplicationName": app_name,
        "apiVersion": vk.VK_MAKE_VERSION(1, 3, 0)})
    layers, extensions, next_ptr, messenger_info, layer_version = [], [], ffi.NULL, None, None
    if validation:
        available = {raw.text(p.layerName): p.specVersion for p in raw.enumerate_items(
            "VkLayerProperties", lib.vkEnumerateInstanceLayerProperties)}
        if VALIDATION_LAYER not in available:
            raise VulkanUnavailable(
                "ETVK_VALIDATION=1 but the Khronos validation layer is not installed: "
                "install it, e.g. `apt-get install vulkan-validationlayers`")
        layers, extensions = [VALIDATION_LAYER], ["VK_EXT_debug_utils"]
        layer_version = version_tuple(available[VALIDATION_LAYER])
        device._message_handle = ffi.new_handle(device)
        messenger_info = ffi.new("VkDebugUtilsMessengerCreateInfoEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            "messageSeverity": SEVERITIES["warning"] | SEVERITIES["error"],
            "messageType": vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT,
            "pfnUserCallback": _debug_callback(), "pUserData": device._message_handle})
        enables = ffi.new("VkValidationFeatureEnableEXT[]", [
            vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT])
        features = ffi.new("VkValidationFeaturesEXT*", {
            "sType": vk.VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT, "pNext": messenger_info,
            "enabledValidationFeatureCount": 1, "pEnabledValidationFeatures": enables})
        keep += [enables, features]
        next_ptr = features
    layer_names, n_layers = strings(layers)
    ext_names, n_ext = strings(extensions)
    info = ffi.new("VkInstanceCreateInfo*", {
        "sType": vk.VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, "pNext": next_ptr,
        "pApplicationInfo": app, "enabledLayerCount": n_layers, "ppEnabledLayerNames": layer_names,
        "enabledExtensionCount": n_ext, "ppEnabledExtensionNames": ext_names})
    out = ffi.new("VkInstance*")
    result = lib.vkCreateInstance(info, ffi.NULL, out)
    if result == vk.VK_ERROR_INCOMPATIBLE_DRIVER:
        raise VulkanUnavailable(NO_DEVICE)
    raw.check(result, "vkCreateInstance")
    instance = out[0]
    if messenger_info is None:
        return instance, None, None
    create = ffi.cast("PFN_vkCreateDebugUtilsMessengerEXT", lib.vkGetInstanceProcAddr(
        instance, b"vkCreateDebugUtilsMessengerEXT"))
    messenger = ffi.new("VkDebugUtilsMessengerEXT*")
    result = create(instance, messenger_info, ffi.NULL, messenger)
    if result != 0:
        lib.vkDestroyInstance(instance, ffi.NULL)
        raw.check(result, "vkCreateDebugUtilsMessengerEXT")
    return instance, messenger[0], layer_version


def destroy_instance(instance, messenger) -> None:
    """Destroy the messenger (if any), then the instance."""
    _, ffi, lib = raw.load()
    if messenger is not None:
        destroy = ffi.cast("PFN_vkDestroyDebugUtilsMessengerEXT", lib.vkGetInstanceProcAddr(
            instance, b"vkDestroyDebugUtilsMessengerEXT"))
        destroy(instance, messenger, ffi.NULL)
    lib.vkDestroyInstance(instance, ffi.NULL)
