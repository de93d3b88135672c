"""The runtime's one exception family.

Every error the runtime raises on purpose derives from `EtvkError`, and also
from the builtin that fits (`RuntimeError` for device trouble, `ValueError`
for bad input), so callers can catch either. Vulkan result codes are mapped to
their names here; this module must not import `vulkan` (it is imported before
anyone knows whether a loader exists). Used by every runtime module and by the
generated op stubs (`ArgumentError`).
"""

from __future__ import annotations

NO_LOADER = (
    "no Vulkan loader (libvulkan.so.1): install it, e.g. "
    "`apt-get install libvulkan1 mesa-vulkan-drivers`"
)
NO_DEVICE = (
    "no Vulkan device: install a driver, e.g. `apt-get install mesa-vulkan-drivers` "
    "for the CPU driver lavapipe"
)

RESULT_NAMES = {
    0: "VK_SUCCESS",
    1: "VK_NOT_READY",
    2: "VK_TIMEOUT",
    3: "VK_EVENT_SET",
    4: "VK_EVENT_RESET",
    5: "VK_INCOMPLETE",
    -1: "VK_ERROR_OUT_OF_HOST_MEMORY",
    -2: "VK_ERROR_OUT_OF_DEVICE_MEMORY",
    -3: "VK_ERROR_INITIALIZATION_FAILED",
    -4: "VK_ERROR_DEVICE_LOST",
    -5: "VK_ERROR_MEMORY_MAP_FAILED",
    -6: "VK_ERROR_LAYER_NOT_PRESENT",
    -7: "VK_ERROR_EXTENSION_NOT_PRESENT",
    -8: "VK_ERROR_FEATURE_NOT_PRESENT",
    -9: "VK_ERROR_INCOMPATIBLE_DRIVER",
    -10: "VK_ERROR_TOO_MANY_OBJECTS",
    -11: "VK_ERROR_FORMAT_NOT_SUPPORTED",
    -12: "VK_ERROR_FRAGMENTED_POOL",
    -13: "VK_ERROR_UNKNOWN",
    -1000069000: "VK_ERROR_OUT_OF_POOL_MEMORY",
    -1000072003: "VK_ERROR_INVALID_EXTERNAL_HANDLE",
    -1000161000: "VK_ERROR_FRAGMENTATION",
    -1000257000: "VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS",
    1000297000: "VK_PIPELINE_COMPILE_REQUIRED",
}


def result_name(code: int) -> str:
    """Return the VkResult name of `code` (e.g. -2 -> "VK_ERROR_OUT_OF_DEVICE_MEMORY")."""
    return RESULT_NAMES.get(code, f"VkResult({code})")


class EtvkError(Exception):
    """Base class of every error the runtime raises on purpose."""


class VulkanUnavailable(EtvkError, RuntimeError):
    """No Vulkan loader or no Vulkan device; the text says what to install."""


class VulkanError(EtvkError, RuntimeError):
    """A Vulkan call returned something other than VK_SUCCESS.

    Attributes:
        result: the VkResult code.
        name: its name, e.g. "VK_ERROR_OUT_OF_DEVICE_MEMORY".
        call: the Vulkan function and what it was doing.
    """

    def __init__(self, result: int, call: str):
        self.result = result
        self.name = result_name(result)
        self.call = call
        super().__init__(f"{call} failed: {self.name}")


class TensorTooLarge(EtvkError, ValueError):
    """A tensor does not fit the device's limits for the requested storage."""


class UnsupportedVariant(EtvkError, ValueError):
    """A shader variant cannot run on this device or with these arguments."""


class _ArgumentMessage:
    """`"<op>: argument '<arg>': <message>"`, with `.op` (the op name), `.arg`, `.message`."""

    def __init__(self, op: object, arg: str, message: str):
        self.op = op if isinstance(op, str) else op.name
        self.arg = arg
        self.message = message
        super().__init__(f"{self.op}: argument '{arg}': {message}")


class ArgumentError(_ArgumentMessage, EtvkError, ValueError):
    """A bad argument value: `ArgumentError(op, arg, message)`.

    Args:
        op: the op name, or any object with a `.name` string.
        arg: the argument's name.
        message: what was expected and what was given.
    """


class ArgumentTypeError(_ArgumentMessage, EtvkError, TypeError):
    """An argument of the wrong type: `ArgumentTypeError(op, arg, message)`, as `ArgumentError`."""


class UnsupportedDtype(EtvkError, TypeError):
    """A dtype that device tensors cannot hold (they hold float32, float16, int32, int8, uint8)."""


class DispatchError(EtvkError, ValueError):
    """A recorded dispatch does not match its variant's interface (names, dtypes, group counts)."""


class DeviceClosed(EtvkError, RuntimeError):
    """A tensor or stream was used after its device was closed."""
