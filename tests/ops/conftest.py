"""Op tests need a Vulkan device; they skip only where none exists at all."""

import pytest

from runtime.device import get_device
from runtime.errors import VulkanUnavailable


@pytest.fixture(autouse=True, scope="session")
def vulkan_device():
    try:
        return get_device()
    except VulkanUnavailable as error:
        pytest.skip(str(error))
