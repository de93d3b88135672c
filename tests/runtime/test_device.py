"""Device choice, GPU family, capabilities, validation messages and close()."""

from __future__ import annotations

import pytest

from runtime import _vk
from runtime.device import (
    CAPABILITY_NAMES,
    GPU_FAMILIES,
    ConfigError,
    Device,
    choose_physical_device,
    current_device,
    get_device,
    gpu_family,
)
from runtime.errors import DeviceClosed

LLVMPIPE, SWIFTSHADER, NVIDIA_PROPRIETARY = 13, 10, 4


@pytest.mark.parametrize("vendor, driver, override, family", [
    (0x13B5, 0, None, "mali"),
    (0x5143, 0, None, "adreno"),
    (0x10DE, NVIDIA_PROPRIETARY, None, "nvidia"),
    (0x1002, 0, None, "amd"),
    (0x1022, 0, None, "amd"),
    (0x8086, 0, None, "intel"),
    (0x1010, 0, None, "powervr"),
    (0x10005, LLVMPIPE, None, "llvmpipe"),
    (0x1AE0, SWIFTSHADER, None, "swiftshader"),
    (0x1234, 0, None, "other"),
    (0x10005, LLVMPIPE, "mali", "mali"),
    (0x10DE, 0, "", "nvidia"),
])
def test_gpu_family(vendor, driver, override, family):
    assert gpu_family(vendor, driver, override) == family


def test_every_family_is_reachable():
    reached = {gpu_family(v, d) for v in (0x13B5, 0x5143, 0x10DE, 0x1002, 0x8086, 0x1010, 0x1234)
               for d in (0, LLVMPIPE, SWIFTSHADER)}
    assert reached == set(GPU_FAMILIES)


def test_bad_family_override_lists_the_families():
    with pytest.raises(ConfigError) as info:
        gpu_family(0x10DE, 0, "geforce")
    assert "ETVK_GPU_FAMILY='geforce'" in str(info.value)
    assert all(f in str(info.value) for f in GPU_FAMILIES)


DEVICES = [("llvmpipe (LLVM 15)", "cpu"), ("Intel UHD 630", "integrated_gpu"),
           ("NVIDIA GeForce RTX 4090", "discrete_gpu"), ("Virtio GPU", "virtual_gpu")]


@pytest.mark.parametrize("candidates, selector, index", [
    (DEVICES, None, 2),
    (DEVICES, "", 2),
    (DEVICES[:2], None, 1),
    ([DEVICES[0], DEVICES[3]], None, 1),
    ([("other thing", "other"), DEVICES[0]], None, 1),
    (DEVICES, "0", 0),
    (DEVICES, "3", 3),
    (DEVICES, "LLVMPIPE", 0),
    (DEVICES, "geforce", 2),
])
def test_choose_physical_device(candidates, selector, index):
    assert choose_physical_device(candidates, selector) == index


@pytest.mark.parametrize("selector", ["4", "radeon"])
def test_choose_physical_device_no_match(selector):
    with pytest.raises(ConfigError, match=f"ETVK_DEVICE='{selector}' matches no Vulkan device; devices: 0: llvmpipe"):
        choose_physical_device(DEVICES, selector)


def test_capability_names_match_codegen():
    from codegen.expressions import CAPABILITIES

    assert tuple(CAPABILITIES) == CAPABILITY_NAMES


def test_lavapipe_capabilities():
    caps = get_device().caps
    assert caps.family == "llvmpipe" and not caps.family_overridden
    assert caps.device_type == "cpu" and caps.driver_id == LLVMPIPE
    assert caps.features <= set(CAPABILITY_NAMES)
    assert caps.supports("shader_int8") and not caps.supports("cooperative_matrix")
    assert caps.limits.max_storage_buffer_range == 128 << 20
    assert len(caps.limits.max_compute_work_group_count) == 3
    assert caps.timestamps and caps.timestamp_period > 0
    assert all(caps.supports_storage_image(f) for f in ("rgba32f", "rgba16f", "rgba32i", "rgba8i", "rgba8ui"))
    with pytest.raises(ValueError, match="unknown capability 'int8'"):
        caps.supports("int8")


def test_get_device_is_process_wide():
    assert get_device() is get_device() is current_device()


def test_family_override_from_environment(monkeypatch):
    monkeypatch.setenv("ETVK_GPU_FAMILY", "adreno")
    device = Device()
    try:
        assert device.caps.family == "adreno" and device.caps.family_overridden
    finally:
        device.close()
    monkeypatch.setenv("ETVK_GPU_FAMILY", "adrenoo")
    with pytest.raises(ConfigError, match="use one of: mali, adreno"):
        Device()


def test_device_selector_from_environment(monkeypatch):
    monkeypatch.setenv("ETVK_DEVICE", "no such gpu")
    with pytest.raises(ConfigError, match="matches no Vulkan device"):
        Device()


def _raw_buffer(device):
    vk, ffi, lib = _vk.load()
    info = ffi.new("VkBufferCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                          "size": 16, "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT})
    out = ffi.new("VkBuffer*")
    _vk.check(lib.vkCreateBuffer(device.handle, info, ffi.NULL, out), "vkCreateBuffer")


@pytest.mark.parametrize("leak", [False, True])
def test_close_leaves_nothing_behind(leak, tiny_library):
    """close() destroys tensors, streams and pipelines; a raw leak proves the check works."""
    import torch

    from runtime.command import Stream
    from runtime.tensor import Tensor

    device = Device(validation=True)
    keep = [Tensor.from_torch(torch.ones(5, 6), storage, device=device) for storage in ("buffer", "texture3d")]
    stream = Stream(device, tiny_library)
    variant = tiny_library.variant("group_ids_buffer_int32")
    out = stream.empty([8], torch.int32, variant.binding("t_out"))
    stream.dispatch(variant, "test", bindings={"t_out": out}, push={"count": 8}, groups=[8])
    stream.run()
    if leak:
        _raw_buffer(device)
    device.close()
    device.close()  # idempotent
    leaks = device.take_validation_messages("error")
    assert bool(leaks) == leak, leaks
    assert all("has not been destroyed" in m for m in leaks)
    for use in (keep[0].to_torch, keep[1].to_torch, stream.run):
        with pytest.raises(DeviceClosed, match="was closed"):
            use()
