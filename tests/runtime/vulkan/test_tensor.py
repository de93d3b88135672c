"""Device tensors: layouts, round trips, limits."""

from __future__ import annotations

import gc
import math

import pytest
import torch

from runtime.errors import TensorTooLarge, UnsupportedDtype
from runtime.vulkan.device import get_device
from runtime.vulkan.memory import (
    DIRECT_READ_LIMIT,
    HOST_FILL_LIMIT,
    Buffer,
    choose_memory_type,
    size_class,
    zero_all,
)
from runtime.vulkan.tensor import Tensor, buffer_bytes, texture_extent

DTYPES = [torch.float32, torch.float16, torch.int32, torch.int8, torch.uint8]
SHAPES = [(), (0,), (1,), (3,), (4,), (5,), (3, 7), (0, 5), (2, 3, 5), (2, 2, 3, 9), (1, 1, 1, 1, 6)]


def _sample(shape, dtype):
    generator = torch.Generator().manual_seed(math.prod(shape) + 7)
    values = torch.randn(shape, generator=generator) * 60
    return values.clamp(0, 255).to(dtype) if dtype == torch.uint8 else values.to(dtype)


@pytest.mark.parametrize("storage", ["buffer", "texture3d", "texture2d"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip(shape, dtype, storage):
    if storage == "texture2d" and len(shape) > 2:
        with pytest.raises(ValueError, match="at most 2 dimensions"):
            Tensor.from_torch(_sample(shape, dtype), storage)
        return
    value = _sample(shape, dtype)
    tensor = Tensor.from_torch(value, storage)
    assert (tensor.shape, tensor.dtype, tensor.storage) == (value.shape, dtype, storage)
    assert tensor.layout == ("contiguous" if storage == "buffer" else "width_packed")
    assert (tensor.numel(), tensor.dim(), tensor.nbytes) == (value.numel(), value.dim(), value.nbytes)
    assert (tensor.memory is None) == (value.numel() == 0)
    back = tensor.to_torch()
    assert back.dtype == dtype and back.shape == value.shape and torch.equal(back, value)


def test_zero_all_fills_every_kind_of_memory_in_one_call():
    # device-local (filled by the GPU), host-mapped (memset) buffers and images at once
    values = [torch.arange(1.0, 13.0).reshape(3, 4), torch.full((5, 3), -2.5), torch.full((2, 6), 9.0)]
    tensors = [Tensor.from_torch(values[0], "buffer"), Tensor.from_torch(values[1], "texture3d")]
    host = Tensor.empty([2, 6], torch.float32, placement="host")
    host.copy_from(values[2])
    device = Tensor.empty([3, 4], torch.float32, placement="device")
    device.copy_from(values[0])
    # larger than HOST_FILL_LIMIT: where mapped from device-local memory, filled by the device
    large = Tensor.from_torch(torch.ones(HOST_FILL_LIMIT // 4 + 1))
    tensors += [host, device, large]
    assert host.memory.host_fill and not device.memory.host_fill
    assert large.memory.host_fill == (large.memory.mapped is not None and not large.memory.device_local)
    assert all(t.to_torch().abs().sum() > 0 for t in tensors)
    zero_all([t.memory for t in tensors])
    for tensor in tensors:
        assert torch.equal(tensor.to_torch(), torch.zeros(tensor.shape)), tensor.storage


@pytest.mark.parametrize("storage", ["buffer", "texture3d", "texture2d"])
def test_from_torch_converts_dtype_and_zeros_is_zero(storage):
    value = torch.tensor([[1.6, -2.2, 3.0], [4.0, 5.5, -6.5]])
    assert torch.equal(Tensor.from_torch(value, storage, torch.int32).to_torch(), value.to(torch.int32))
    Tensor.from_torch(torch.full([3, 5], 7.0), storage, torch.float16)  # collected: its memory is recycled
    empty = Tensor.empty([3, 5], torch.float16, storage)
    assert empty.to_torch().shape == (3, 5)
    zeros = Tensor.zeros([3, 5], torch.float16, storage).to_torch()
    assert zeros.dtype == torch.float16 and torch.equal(zeros, torch.zeros(3, 5, dtype=torch.float16))


@pytest.mark.parametrize("nbytes, limit, size", [
    (1, 1 << 30, 256), (256, 1 << 30, 256), (257, 1 << 30, 320), (320, 1 << 30, 320), (321, 1 << 30, 384),
    (1000, 1 << 30, 1024), (1025, 1 << 30, 1280), ((3 << 20) + 1, 1 << 30, 7 << 19), (300, 300, 300),
    (1000, 900, 1000),
])
def test_size_class(nbytes, limit, size):
    assert size_class(nbytes, limit) == size


def test_buffer_layout_is_natural_bytes_with_zero_padding():
    value = torch.tensor([1, -2, 3, -4, 5], dtype=torch.int8)
    tensor = Tensor.from_torch(value)
    assert tensor.memory.nbytes == 16
    raw = torch.empty(16, dtype=torch.uint8)
    tensor.memory.read(raw.data_ptr(), 16)
    assert raw.tolist() == [1, 254, 3, 252, 5] + [0] * 11


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=str)
def test_staged_buffer_round_trip(dtype):
    """Device-local memory that is never mapped: uploads and downloads go through staging."""
    device = get_device()
    value = _sample((37,), dtype)
    buffer = Buffer(device, buffer_bytes(value.shape, dtype), placement="device")
    assert buffer.mapped is None
    buffer.write(value.data_ptr(), value.nbytes)
    back = torch.empty_like(value)
    buffer.read(back.data_ptr(), value.nbytes)
    assert torch.equal(back, value)
    buffer.zero()
    buffer.read(back.data_ptr(), value.nbytes)
    assert not back.any()


@pytest.mark.parametrize("shape, extent", [
    ((), (1, 1, 1)), ((5,), (2, 1, 1)), ((3, 8), (2, 3, 1)), ((2, 3, 9), (3, 3, 2)), ((2, 2, 3, 4), (1, 3, 4)),
])
def test_texture_extent(shape, extent):
    assert texture_extent(shape) == extent


@pytest.mark.parametrize("shape, dtype, nbytes", [
    ((), torch.float32, 16), ((5,), torch.int8, 16), ((17,), torch.int8, 32), ((3, 3), torch.float16, 32),
    ((0,), torch.float32, 0),
])
def test_buffer_bytes(shape, dtype, nbytes):
    assert buffer_bytes(shape, dtype) == nbytes


HOST = 0x2 | 0x4  # HOST_VISIBLE | HOST_COHERENT
LOCAL = 0x1


@pytest.mark.parametrize("types, bits, preferences, index", [
    ([LOCAL | HOST | 0x8], 0b1, [LOCAL | HOST, LOCAL, HOST], 0),
    ([HOST, LOCAL], 0b11, [LOCAL | HOST, LOCAL, HOST], 1),
    ([HOST, LOCAL, LOCAL | HOST], 0b111, [LOCAL | HOST, LOCAL, HOST], 2),
    ([HOST, LOCAL, LOCAL | HOST], 0b011, [LOCAL | HOST, LOCAL, HOST], 1),
    ([HOST, LOCAL], 0b01, [LOCAL | HOST, LOCAL, HOST], 0),
    ([LOCAL], 0b1, [HOST], None),
])
def test_choose_memory_type(types, bits, preferences, index):
    assert choose_memory_type(types, bits, preferences) == index


LABEL = "etvk.quantize_per_tensor.default: argument 'input'"


def _too_large_case(case, limits):
    """(shape, dtype, storage, needles, hint) of `case`, sized from the device's limits."""
    max_bytes = min(limits.max_storage_buffer_range, limits.max_memory_allocation_size)
    side, max_alloc = limits.max_image_dimension_3d, limits.max_memory_allocation_size
    if case == "buffer over, as wide an image as allowed":  # extent side x side x depth
        depth = max_bytes // (16 * side * side) + 1
        shape, image_bytes = (depth, side, 4 * side), depth * side * side * 16
        needles = [f"shape [{depth}, {side}, {4 * side}] (float32)", f"{image_bytes}-byte buffer", f"{max_bytes} bytes"]
        return shape, torch.float32, "buffer", needles, image_bytes <= max_alloc
    if case == "image over maxImageDimension3D":
        needles = [f"shape [{side + 1}, 4] (int8)", f"1x{side + 1}x1-texel", f"{side} texels"]
        return (side + 1, 4), torch.int8, "texture3d", needles, True
    if case == "buffer over, image too tall":
        width = 4 * (max_bytes // (16 * (side + 1) ** 2) + 1)
        return (side + 1, side + 1, width), torch.float32, "buffer", [f"shape [{side + 1}, {side + 1}, {width}]",
                                                                       f"{max_bytes} bytes"], False
    numel = max_bytes // 4 + 1  # 1-D: the image would be over maxImageDimension3D wide
    nbytes = -(-numel * 4 // 16) * 16
    return (numel,), torch.float32, "buffer", [f"shape [{numel}]", f"{nbytes}-byte buffer"], False


@pytest.mark.parametrize("case", ["buffer over, as wide an image as allowed", "image over maxImageDimension3D",
                                  "buffer over, image too tall", "buffer over, 1-D"])
@pytest.mark.parametrize("make", ["empty", "from_torch"])
def test_too_large(case, make):
    shape, dtype, storage, needles, fits_elsewhere = _too_large_case(case, get_device().caps.limits)
    with pytest.raises(TensorTooLarge) as info:
        if make == "empty":
            Tensor.empty(shape, dtype, storage, label=LABEL)
        else:  # a stride-0 view: nothing large is allocated on the host
            Tensor.from_torch(torch.zeros(1, dtype=dtype).expand(shape), storage, label=LABEL)
    text = str(info.value)
    assert text.startswith(LABEL + ": ")
    assert all(n in text for n in needles), text
    other = "buffer" if storage == "texture3d" else "texture3d"
    assert text.endswith(f"; storage='{other}' would fit") == fits_elsewhere, text
    assert ("would fit" in text) == fits_elsewhere, text


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.bool, torch.bfloat16], ids=str)
def test_unsupported_dtype(dtype):
    with pytest.raises(UnsupportedDtype, match=f"input: dtype {dtype} is not supported.*float32, float16, int32, int8, uint8"):
        Tensor.from_torch(torch.zeros(3, dtype=dtype), label="input")


def test_staging_prefers_host_cached_memory():
    cached = HOST | 0x8
    assert choose_memory_type([LOCAL | HOST, HOST, cached], 0b111, [cached, HOST]) == 2


def test_large_reads_of_uncached_device_memory_go_through_staging(monkeypatch):
    """Device-local mapped memory (a GPU's BAR) is read uncached: a large read takes a copy."""
    device = get_device()
    data = torch.arange(3 * DIRECT_READ_LIMIT, dtype=torch.int32).to(torch.int8)
    copies = []
    copy = Buffer._copy
    monkeypatch.setattr(Buffer, "_copy", lambda self, *args: copies.append(args[2]) or copy(self, *args))
    for uncached, nbytes, staged in ((False, data.numel(), False), (True, DIRECT_READ_LIMIT, False),
                                     (True, data.numel(), True)):
        buffer = Buffer(device, data.numel())
        buffer.write(data.data_ptr(), data.numel())
        buffer.uncached_reads = uncached
        out = torch.empty(nbytes, dtype=torch.int8)
        copies.clear()
        buffer.read(out.data_ptr(), nbytes)
        assert torch.equal(out, data[:nbytes])
        assert (copies == ["buffer download"]) == (staged and buffer.mapped is not None), (uncached, nbytes)
        tail = torch.empty(nbytes - 5, dtype=torch.int8)  # from an offset, either way
        buffer.read(tail.data_ptr(), tail.numel(), 5)
        assert torch.equal(tail, data[5:nbytes]), (uncached, nbytes)


@pytest.mark.parametrize("make", [
    lambda v: v,  # copied from as it is
    lambda v: v.t().contiguous().t(),  # not contiguous
    lambda v: v.clone().requires_grad_(True),  # under autograd
    lambda v: v.double(),  # converted
], ids=["plain", "strided", "requires_grad", "float64"])
@pytest.mark.parametrize("storage", ["buffer", "texture3d"])
def test_upload_of_any_host_tensor(make, storage):
    value = torch.randn(5, 6, generator=torch.Generator().manual_seed(3))
    assert torch.equal(Tensor.from_torch(make(value), storage, torch.float32).to_torch(), value)


@pytest.mark.parametrize("make", [lambda device: Buffer(device, 3 * 2**20 + 12),
                                  lambda device: Tensor.empty((5, 7, 12), torch.float32, "texture3d",
                                                              device=device).memory])
def test_memory_collected_in_a_reference_cycle_is_not_given_back_destroyed(make):
    """The garbage collector runs an unreachable allocation's finalizer (which destroys its
    Vulkan objects) before the `__del__` of the memory object that held it; that `__del__`
    must not hand the destroyed allocation to the spare memory, whose next taker would bind
    a destroyed buffer or image (a crash in the validation layer, heap damage on lavapipe)."""
    device = get_device()
    memory = make(device)
    key = memory._key
    while device.spare_memory.take(key) is not None:  # nothing of this kind kept before
        pass
    cycle = [memory]
    cycle.append(cycle)  # the memory and its allocation are reachable only through a cycle
    del memory, cycle
    gc.collect()
    kept = device.spare_memory.take(key)
    assert kept is None or kept.destroy.alive, "the spare memory kept a destroyed allocation"


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_to_torch_last_downloads_the_last_index(dim):
    value = torch.randn(1, 5, 7) if dim < 2 else torch.randn(2, 3, 6)
    tensor = Tensor.from_torch(value)
    assert torch.equal(tensor.to_torch_last(dim), value.narrow(dim, value.shape[dim] - 1, 1))
