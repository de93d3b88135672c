"""Device choice, GPU family, capabilities, layer-version gating, recycling, validation messages, close()."""

from __future__ import annotations

import re

import pytest

from runtime.errors import DeviceClosed
from runtime.vulkan import probe, raw
from runtime.vulkan.coopmat import COOPMAT_CAPABILITIES
from runtime.vulkan.device import (
    CAPABILITY_NAMES,
    DEVICE_TYPES,
    GPU_FAMILIES,
    ConfigError,
    Device,
    choose_physical_device,
    current_device,
    fence_spin_seconds,
    get_device,
    gpu_family,
)
from runtime.vulkan.recycler import Recycler

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


@pytest.mark.parametrize("setting, device_type, seconds", [
    (None, "discrete_gpu", 200e-6),  # the default: poll on GPUs...
    ("", "integrated_gpu", 200e-6),
    (None, "cpu", 0.0),  # ...not on CPU drivers
    ("0", "discrete_gpu", 0.0),
    ("50", "cpu", 50e-6),
])
def test_fence_spin(setting, device_type, seconds):
    assert fence_spin_seconds(setting, device_type) == pytest.approx(seconds)


@pytest.mark.parametrize("setting", ["-5", "1.5", "fast"])
def test_bad_fence_spin_is_refused(setting):
    with pytest.raises(ConfigError, match="ETVK_FENCE_SPIN_US"):
        fence_spin_seconds(setting, "discrete_gpu")


def test_capability_names_match_codegen():
    from codegen.expressions import CAPABILITIES

    assert tuple(CAPABILITIES) == CAPABILITY_NAMES


def test_device_capabilities():
    """The chosen device's report is self-consistent, whatever the device."""
    caps, device = get_device().caps, get_device()
    assert caps.family == gpu_family(caps.vendor_id, caps.driver_id) and not caps.family_overridden
    assert caps.device_type in DEVICE_TYPES.values()
    if caps.driver_id == LLVMPIPE:
        assert caps.family == "llvmpipe" and caps.device_type == "cpu"
    assert caps.features <= set(CAPABILITY_NAMES)
    for name in CAPABILITY_NAMES:
        if name in COOPMAT_CAPABILITIES:  # derived from the cooperative-matrix properties
            assert not caps.supports(name) or "cooperative_matrix" in caps.features, name
        else:
            assert caps.supports(name) == (name in caps.features)
        assert not (caps.supports(name) and caps.why_not(name)), name  # held back means not enabled
    limits = caps.limits
    assert 0 < limits.max_storage_buffer_range < 2**32 and limits.max_memory_allocation_size > 0
    assert len(limits.max_compute_work_group_count) == 3 and min(limits.max_compute_work_group_count) >= 65535
    assert limits.max_image_dimension_3d >= 256 and limits.max_push_constants_size >= 128
    assert caps.timestamps == (device.timestamp_valid_bits > 0)
    assert not caps.timestamps or caps.timestamp_period > 0
    # storage images of these formats are mandatory in Vulkan
    assert all(caps.supports_storage_image(f) for f in ("rgba32f", "rgba16f", "rgba32i", "rgba8i", "rgba8ui"))
    with pytest.raises(ValueError, match="unknown capability 'int8'"):
        caps.supports("int8")


@pytest.mark.parametrize("layer, available, held", [
    (None, {"VK_KHR_cooperative_matrix": ("cooperative_matrix",)}, {}),
    # cooperative_matrix is chained anyway: layer_gaps.py drops what the old layer says about it
    ((1, 3, 239), {"VK_KHR_cooperative_matrix": ("cooperative_matrix",),
                   "VK_KHR_shader_integer_dot_product": ("integer_dot_product",),
                   "VK_KHR_8bit_storage": ("storage_buffer_8bit",)}, {}),
    ((1, 3, 255), {"VK_KHR_cooperative_matrix": ("cooperative_matrix",)}, {}),
    ((1, 3, 254), {"VK_KHR_shader_integer_dot_product": ("integer_dot_product",)}, {}),
    ((1, 2, 170), {"VK_KHR_shader_integer_dot_product": ("integer_dot_product",),
                   "VK_KHR_cooperative_matrix": ("cooperative_matrix",)},
     {"integer_dot_product": "the validation layer, header 170, predates VK_KHR_shader_integer_dot_product"}),
])
def test_held_back(layer, available, held):
    assert probe.held_back(available, layer) == held


def test_every_feature_extension_has_a_header_version():
    """Extensions newer than the oldest layer we meet must be in EXTENSION_HEADERS to be gated."""
    newer_than_1_2_140 = {"VK_KHR_shader_integer_dot_product", "VK_KHR_maintenance4", "VK_KHR_cooperative_matrix"}
    assert {s[3] for s in probe.FEATURE_STRUCTS} & newer_than_1_2_140 == set(probe.EXTENSION_HEADERS)


@pytest.mark.parametrize("validation", [True, False])
def test_a_layer_older_than_an_extension_holds_its_feature_back(validation, monkeypatch):
    """Pretend VK_KHR_8bit_storage is newer than the layer: under validation it is neither chained nor enabled."""
    monkeypatch.setitem(probe.EXTENSION_HEADERS, "VK_KHR_8bit_storage", (1, 4095, 0))
    device = Device(validation=validation)
    try:
        caps = device.caps
        if validation:
            assert not caps.supports("storage_buffer_8bit")
            assert re.fullmatch(r"the validation layer, header \d+, predates VK_KHR_8bit_storage",
                                caps.why_not("storage_buffer_8bit"))
        else:
            assert caps.held_back == () and caps.why_not("storage_buffer_8bit") == ""
            assert caps.supports("storage_buffer_8bit") == get_device().caps.supports("storage_buffer_8bit")
        reference = get_device().caps
        others = set(CAPABILITY_NAMES) - {"storage_buffer_8bit"} - dict(caps.held_back).keys() - dict(
            reference.held_back).keys()  # e.g. cooperative_matrix under an old layer
        assert caps.features & others == reference.features & others
    finally:
        device.close()
    assert device.take_validation_messages() == []


class _Item:
    def __init__(self, log, name, nbytes=0):
        self.log, self.name, self.nbytes = log, name, nbytes

    def destroy(self):
        self.log.append(self.name)


def test_recycler_bounds_and_order():
    destroyed = []
    spare = Recycler(max_entries=3, max_bytes=100)
    assert spare.take("a") is None
    items = [_Item(destroyed, i, 30) for i in range(4)]
    for key, item in zip("aabc", items, strict=True):
        spare.give(key, item)
    assert destroyed == [1] and (spare.entries, spare.nbytes) == (3, 90)  # over 3 entries: one of the oldest key
    assert spare.take("a") is items[0] and spare.take("a") is None
    spare.give("d", _Item(destroyed, "big", 101))  # over max_bytes on its own
    spare.give("d", _Item(destroyed, "d", 60))  # 120 bytes kept: the oldest key goes
    assert destroyed == [1, "big", 2] and spare.take("c") is items[3] and spare.nbytes == 60
    spare.close()
    spare.give("e", _Item(destroyed, "late"))
    assert destroyed == [1, "big", 2, "d", "late"] and spare.entries == spare.nbytes == 0


def test_recycler_retires_what_it_destroys_for_its_bounds():
    destroyed, retired = [], []
    spare = Recycler(max_entries=1, max_bytes=100, retire=lambda item: retired.append(item.name))
    spare.give("a", _Item(destroyed, "a", 10))
    spare.give("b", _Item(destroyed, "b", 10))  # over 1 entry: "a" is retired, then destroyed
    spare.give("c", _Item(destroyed, "big", 101))
    assert retired == destroyed == ["a", "big"]
    spare.close()  # the device is going: nothing to retire first
    assert destroyed == ["a", "big", "b"] and retired == ["a", "big"]


def test_stream_and_memory_are_recycled(tiny_library, recorded):
    import torch

    from runtime.vulkan.stream import Stream
    from runtime.vulkan.tensor import Tensor

    device = get_device()
    variant = tiny_library.variant("group_ids_buffer_int32")
    out = Tensor.empty([8], torch.int32)
    for reuse in (True, False):  # the same recording, or recorded again into the same command buffer
        device.recordings.reuse = reuse
        command_buffers = []
        try:
            for _ in range(2):
                with Stream(device) as stream:
                    stream.dispatch(variant, "test", bindings={"t_out": out}, push={"count": 8}, groups=[8])
                    stream.run()
                    command_buffers.append(stream._resources.cb)
        finally:
            device.recordings.reuse = True
        assert command_buffers[0] == command_buffers[1]
    assert len(recorded) == 3  # once with reuse, twice without
    for storage in ("buffer", "texture3d"):
        tensor = Tensor.empty([3, 50], torch.float32, storage)
        handle = tensor.memory.handle
        del tensor  # its memory goes back to the device's spare memory...
        assert Tensor.empty([3, 50], torch.float32, storage).memory.handle == handle  # ...and is taken again
        assert Tensor.empty([3, 49], torch.float32, storage).memory.handle == handle  # same size class / extent
        assert Tensor.empty([3, 80], torch.float32, storage).memory.handle != handle


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
    vk, ffi, lib = raw.load()
    info = ffi.new("VkBufferCreateInfo*", {"sType": vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                                          "size": 16, "usage": vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT})
    out = ffi.new("VkBuffer*")
    raw.check(lib.vkCreateBuffer(device.handle, info, ffi.NULL, out), "vkCreateBuffer")


@pytest.mark.parametrize("leak", [False, True])
def test_close_leaves_nothing_behind(leak, tiny_library):
    """close() destroys tensors, streams and pipelines; a raw leak proves the check works."""
    import torch

    from runtime.vulkan.stream import Stream
    from runtime.vulkan.tensor import Tensor

    device = Device(validation=True)
    keep = [Tensor.from_torch(torch.ones(5, 6), storage, device=device) for storage in ("buffer", "texture3d")]
    variant = tiny_library.variant("group_ids_buffer_int32")
    for _ in range(2):  # the first stream is collected unclosed; both outputs' memory is kept as spare
        stream = Stream(device)
        out = stream.empty([8], torch.int32, variant.binding("t_out"))
        stream.dispatch(variant, "test", bindings={"t_out": out}, push={"count": 8}, groups=[8])
        stream.run()
        del out
    for recycled in (Tensor.empty([7], torch.int8, storage, device=device) for storage in ("buffer", "texture3d")):
        del recycled
    assert device.spare_memory.entries >= 2 and device.recordings.entries == 0
    Stream(device).close()  # nothing recorded: no resources taken
    assert device.recordings.entries == 0
    with Stream(device) as kept:
        kept.dispatch(variant, "test", bindings={"t_out": None}, push={"count": 8}, groups=[8])
        kept.run()
    assert device.recordings.entries == 1
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


def test_cpu_devices_check_buffer_bounds():
    """On a CPU device (lavapipe) device memory is the process's own: robustBufferAccess is on
    there, so a shader's out-of-range write cannot damage the heap; GPUs run without it."""
    device = get_device()
    assert device.robust_buffer_access == (device.caps.device_type == "cpu")
