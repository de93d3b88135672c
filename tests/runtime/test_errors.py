"""The exception family: names, messages, base classes."""

from __future__ import annotations

import pytest

from runtime.errors import (
    NO_DEVICE,
    NO_LOADER,
    ArgumentError,
    ArgumentTypeError,
    EtvkError,
    TensorTooLarge,
    UnsupportedVariant,
    VulkanError,
    VulkanUnavailable,
    result_name,
)


class _Op:
    name = "etvk.quantize_per_tensor.default"


@pytest.mark.parametrize("code, name", [
    (0, "VK_SUCCESS"), (1, "VK_NOT_READY"), (2, "VK_TIMEOUT"), (5, "VK_INCOMPLETE"),
    (-2, "VK_ERROR_OUT_OF_DEVICE_MEMORY"), (-4, "VK_ERROR_DEVICE_LOST"),
    (-1000069000, "VK_ERROR_OUT_OF_POOL_MEMORY"), (12345, "VkResult(12345)"),
])
def test_result_names(code, name):
    assert result_name(code) == name
    error = VulkanError(code, "vkQueueSubmit")
    assert (error.result, error.name, error.call) == (code, name, "vkQueueSubmit")
    assert str(error) == f"vkQueueSubmit failed: {name}"


@pytest.mark.parametrize("cls, base", [
    (ArgumentError, ValueError), (ArgumentTypeError, TypeError), (TensorTooLarge, ValueError),
    (UnsupportedVariant, ValueError), (VulkanError, RuntimeError), (VulkanUnavailable, RuntimeError),
])
def test_family(cls, base):
    assert issubclass(cls, EtvkError) and issubclass(cls, base)


@pytest.mark.parametrize("op", ["etvk.quantize_per_tensor.default", _Op()])
@pytest.mark.parametrize("cls", [ArgumentError, ArgumentTypeError])
def test_argument_error_text(op, cls):
    error = cls(op, "scale", "must be > 0, got -1.0")
    assert str(error) == "etvk.quantize_per_tensor.default: argument 'scale': must be > 0, got -1.0"
    assert (error.op, error.arg, error.message) == (
        "etvk.quantize_per_tensor.default", "scale", "must be > 0, got -1.0")


@pytest.mark.parametrize("text, package", [(NO_LOADER, "libvulkan1"), (NO_DEVICE, "mesa-vulkan-drivers")])
def test_unavailable_is_one_line_with_a_fix(text, package):
    assert "\n" not in text and f"apt-get install {package}" in text
