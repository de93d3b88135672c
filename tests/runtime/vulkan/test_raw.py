"""The binding helpers of runtime/vulkan/raw.py that need no device."""

from __future__ import annotations

import pytest

from runtime.errors import VulkanError
from runtime.vulkan import raw

COUNT, WRITTEN = 3, 2


def _fake_query(first_result=0, fill_result=0, seen=None):
    """A two-call query of VkCooperativeMatrixPropertiesKHR: COUNT items, then WRITTEN filled."""
    _, ffi, _ = raw.load()

    def query(handle, count, items):
        if items == ffi.NULL:
            count[0] = COUNT
            return first_result
        seen.extend(items[i].sType for i in range(count[0]))
        for i in range(WRITTEN):
            items[i].MSize = 16 * (i + 1)
        count[0] = WRITTEN
        return fill_result

    return query


def test_enumerate_items_sets_stype_and_returns_what_was_written():
    vk, _, _ = raw.load()
    stype = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    for fill_result in (0, vk.VK_INCOMPLETE):  # VK_INCOMPLETE: fewer written than asked, not an error
        seen = []
        items = raw.enumerate_items("VkCooperativeMatrixPropertiesKHR",
                                    _fake_query(fill_result=fill_result, seen=seen), None, stype=stype)
        assert seen == [stype] * COUNT
        assert [item.MSize for item in items] == [16, 32]


@pytest.mark.parametrize("first, fill", [(-1, 0), (0, -1), (5, 0)])
def test_enumerate_items_raises_on_failure(first, fill):
    """An error code from either call, or VK_INCOMPLETE (5) from the count call, raises."""
    with pytest.raises(VulkanError, match="enumerate VkCooperativeMatrixPropertiesKHR"):
        raw.enumerate_items("VkCooperativeMatrixPropertiesKHR", _fake_query(first, fill, []), None)
