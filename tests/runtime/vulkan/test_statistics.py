"""The driver compiler's statistics of a pipeline (runtime/vulkan/statistics.py)."""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest

from runtime.errors import UnsupportedVariant
from runtime.ops.library import catalog
from runtime.vulkan.device import get_device
from runtime.vulkan.pipeline import spec_values
from runtime.vulkan.statistics import pipeline_statistics
from runtime.vulkan.workgroup_memory import workgroup_memory_bytes


def _reporting_device():
    device = get_device()
    if not device.caps.pipeline_statistics:
        pytest.skip(f"{device.caps.name} cannot report pipeline statistics")
    return device


def test_statistics_of_a_variant(tiny_library):
    found = pipeline_statistics(_reporting_device(), tiny_library.variant("affine_buffer_float"), {"OFFSET": 5})
    assert found, "the driver reported no statistics"
    for statistic in found:
        assert statistic.executable and statistic.name, statistic
        assert isinstance(statistic.value, bool | int | float), statistic


def test_shared_memory_follows_the_specialization():
    """q8ta_gemm's staging arrays grow with BLOCK_K: a driver that reports shared memory
    must report more for the longer chunk (the statistics are of the specialized pipeline)."""
    device = _reporting_device()
    variant = catalog().variant("q8ta_gemm_fallback")

    def shared(block_k):
        sizes = [s.value for s in pipeline_statistics(device, variant, {"BLOCK_K": block_k})
                 if "shared memory" in s.name.lower()]
        if not sizes:
            pytest.skip(f"{device.caps.name} reports no shared-memory statistic")
        return sizes[0]

    assert shared(16) > shared(8)


@pytest.mark.parametrize("name, specs", [
    ("q8ta_gemm_fallback", {"BLOCK_K": 16}), ("q8ta_gemm_fallback", {"SPLIT_K": 4, "BLOCK_K": 4}),
    ("linear_qta8a_qga4w_gemm_fallback_buffer_buffer", {}),
    ("linear_qta8a_qga4w_coop_buffer", {"STEPS": 4}), ("q8ta_gemm_coop_k128_w16", {})])
def test_reported_shared_memory_within_the_spirv_figure(name, specs):
    """What the driver reports never exceeds what runtime/vulkan/workgroup_memory.py reads from
    the SPIR-V for the same specialization: the Vulkan spec bounds a device's use by that
    layout, and the pipeline check relies on it (NVIDIA reports exactly that figure)."""
    device = _reporting_device()
    variant = catalog().variant(name)
    runnable, why = variant.runnable(device.caps)
    if not runnable:
        pytest.skip(why)
    reported = [s.value for s in pipeline_statistics(device, variant, specs) if "shared memory" in s.name.lower()]
    if not reported:
        pytest.skip(f"{device.caps.name} reports no shared-memory statistic")
    assert 0 < reported[0] <= workgroup_memory_bytes(variant.spirv(), spec_values(variant, specs))


def test_unknown_spec_constant(tiny_library):
    device = _reporting_device()
    with pytest.raises(UnsupportedVariant, match=r"no spec constant\(s\) \['TILE'\]"):
        pipeline_statistics(device, tiny_library.variant("affine_buffer_float"), {"TILE": 2})


def test_refused_where_the_driver_cannot_report(tiny_library):
    caps = get_device().caps
    without = SimpleNamespace(caps=dataclasses.replace(caps, pipeline_statistics=False))
    message = (f"device {caps.name} cannot report pipeline statistics: "
               "the driver lacks VK_KHR_pipeline_executable_properties")
    with pytest.raises(UnsupportedVariant, match=re.escape(message)):
        pipeline_statistics(without, tiny_library.variant("affine_buffer_float"))
