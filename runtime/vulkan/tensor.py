"""Device tensors: a shape, a dtype, a storage kind and the memory holding it.

Layouts (docs/internals.md section 2): a "buffer" tensor holds the natural
bytes of a contiguous torch tensor, its allocation rounded up to 16 bytes and
zero padded; a "texture3d" tensor of sizes [..., H, W] is a 3-D image of
ceil(W/4) x H x D texels (D = product of the leading sizes), 4 consecutive
last-dimension values per texel, padding 0; a "texture2d" tensor (at most 2-D,
[H, W]) is a 2-D image of ceil(W/4) x H texels. An int8 [N, C, H, W] buffer
tensor may instead hold a packed int8 layout (4W4C, 4C, 4C1W; OPS.md, packed
and unpacked by runtime/layouts.py). A 0-d tensor is stored as shape
[1]; an empty tensor has no memory. `Tensor.empty` leaves the memory
uninitialised (it may be recycled), `Tensor.zeros` fills it with zeros.
Limits are checked before allocation and reported as `TensorTooLarge`. It
must not record shader work (stream.py does). Called by stream.py, the op
stubs (through Stream) and tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from runtime.errors import TensorTooLarge, UnsupportedDtype
from runtime.vulkan import layouts, raw
from runtime.vulkan.device import get_device
from runtime.vulkan.interface import IMAGE_STORAGES, STORAGES
from runtime.vulkan.memory import Buffer, Image3D
from runtime.vulkan.probe import IMAGE_FORMATS

# The default memory layout of each storage (docs/internals.md section 2); int8
# buffers may also hold a packed layout of layouts.py.
LAYOUTS = {"buffer": "contiguous", "texture3d": "width_packed", "texture2d": "width_packed"}
BUFFER_ALIGNMENT = 16


@dataclass(frozen=True)
class DTypeInfo:
    """How one dtype is stored: element size and the storage-image format (GLSL name)."""

    name: str
    torch_dtype: torch.dtype
    itemsize: int
    image_format: str

    @property
    def vk_format(self) -> str:
        """The VkFormat constant name of `image_format`."""
        return IMAGE_FORMATS[self.image_format]


DTYPES = {d.torch_dtype: d for d in (
    DTypeInfo("float32", torch.float32, 4, "rgba32f"),
    DTypeInfo("float16", torch.float16, 2, "rgba16f"),
    DTypeInfo("int32", torch.int32, 4, "rgba32i"),
    DTypeInfo("int8", torch.int8, 1, "rgba8i"),
    DTypeInfo("uint8", torch.uint8, 1, "rgba8ui"),
)}
_BY_NAME = {d.name: d for d in DTYPES.values()}


def dtype_info(dtype: torch.dtype | str, label: str = "tensor") -> DTypeInfo:
    """Return how `dtype` (a torch dtype or its name, e.g. "int8") is stored.

    Raises:
        UnsupportedDtype: not one of float32, float16, int32, int8, uint8.
    """
    info = DTYPES.get(dtype) or _BY_NAME.get(dtype)
    if info is not None:
        return info
    raise UnsupportedDtype(f"{label}: dtype {dtype} is not supported on the device; "
                           f"use one of {', '.join(d.name for d in DTYPES.values())}")


def texture_extent(shape) -> tuple[int, int, int]:
    """The (width, height, depth) texel extent of an image tensor of `shape` (depth 1 for 2-D)."""
    sizes = list(shape) or [1]
    height = sizes[-2] if len(sizes) >= 2 else 1
    return -(-sizes[-1] // 4), height, math.prod(sizes[:-2])


def buffer_bytes(shape, dtype: torch.dtype, layout: str = "contiguous") -> int:
    """The allocation size of a buffer tensor: its bytes (packed words for a
    packed layout) rounded up to 16."""
    if layout in layouts.PACKED_LAYOUTS:
        nbytes = 4 * layouts.packed_words(shape, layout)
    else:
        nbytes = math.prod(shape) * (DTYPES.get(dtype) or dtype_info(dtype)).itemsize
    return -(-nbytes // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT


def _check_layout(shape, info: DTypeInfo, storage: str, layout: str | None, label: str) -> str:
    if storage == "texture2d" and len(shape) > 2:
        raise ValueError(f"{label}: storage 'texture2d' holds tensors of at most 2 dimensions, "
                         f"got shape {list(shape)}")
    if layout is None or layout == LAYOUTS[storage]:
        return LAYOUTS[storage]
    if layout not in layouts.PACKED_LAYOUTS:
        raise ValueError(f"{label}: layout must be {LAYOUTS[storage]!r} or one of "
                         f"{layouts.PACKED_LAYOUTS}, got {layout!r}")
    if info.name != "int8" or storage != "buffer" or len(shape) != 4:
        raise ValueError(f"{label}: packed layout {layout} needs a 4-D int8 buffer tensor, "
                         f"got shape {list(shape)} {info.name} {storage}")
    return layout


def _check_fits(shape, info: DTypeInfo, storage: str, layout: str, caps, label: str) -> None:
    limits = caps.limits
    max_bytes = min(limits.max_storage_buffer_range, limits.max_memory_allocation_size)
    buffer_fits = buffer_bytes(shape, info.torch_dtype, layout) <= max_bytes
    if storage == "buffer" and buffer_fits:
        return
    extent = texture_extent(shape)
    image_bytes = math.prod(extent) * 4 * info.itemsize
    dims, side = ((2, limits.max_image_dimension_2d) if storage == "texture2d"
                  else (3, limits.max_image_dimension_3d))
    image_fits = max(extent) <= side and image_bytes <= limits.max_memory_allocation_size
    shape_text = f"shape {list(shape)} ({info.name})"
    if storage == "buffer" and not buffer_fits:
        hint = "; storage='texture3d' would fit" if image_fits else ""
        raise TensorTooLarge(
            f"{label}: {shape_text} needs a {buffer_bytes(shape, info.torch_dtype, layout)}-byte buffer, "
            f"over the device limit of {max_bytes} bytes (maxStorageBufferRange / "
            f"maxMemoryAllocationSize){hint}")
    if storage in IMAGE_STORAGES and not image_fits:
        hint = "; storage='buffer' would fit" if buffer_fits else ""
        raise TensorTooLarge(
            f"{label}: {shape_text} needs a {'x'.join(map(str, extent[:dims]))}-texel {dims}-D "
            f"image ({image_bytes} bytes), over the device limits of {side} texels a side "
            f"(maxImageDimension{dims}D) and {limits.max_memory_allocation_size} bytes{hint}")


class Tensor:
    """A tensor in device memory (`Tensor.from_torch` / `Tensor.empty` / `Tensor.zeros` create one).

    Attributes:
        shape: torch.Size of the logical tensor.
        dtype: torch.dtype.
        storage: "buffer", "texture3d" or "texture2d".
        layout: how values sit in that storage: "contiguous" (buffer, row-major),
            "width_packed" (images, 4 last-dimension values per texel) or a
            packed int8 layout "4W4C", "4C", "4C1W" (int8 [N, C, H, W] buffers).
        memory: the `Buffer` / `Image3D` holding it, or None when empty.
    """

    def __init__(self, shape, dtype: torch.dtype, storage: str, label: str = "tensor", device=None,
                 layout: str | None = None, memory: Buffer | None = None, placement: str = "auto"):
        if storage not in STORAGES:
            raise ValueError(f"{label}: storage must be one of {STORAGES}, got {storage!r}")
        info = dtype_info(dtype, label)
        self.shape, self.dtype, self.storage = torch.Size(shape), info.torch_dtype, storage
        self.layout = _check_layout(self.shape, info, storage, layout, label)
        if device is None:
            device = get_device()
        self.device, self.memory = device, None
        if self.numel() == 0:
            return
        needed = buffer_bytes(self.shape, self.dtype, self.layout)
        limits = device.caps.limits
        if storage != "buffer" or needed > min(limits.max_storage_buffer_range,
                                               limits.max_memory_allocation_size):
            _check_fits(self.shape, info, storage, self.layout, device.caps, label)
        if memory is not None:  # a view of memory another owner planned (runtime.programs)
            if storage != "buffer" or memory.device is not device or memory.nbytes < needed:
                raise ValueError(f"{label}: a {storage} of {needed} bytes cannot live in {memory!r}")
            self.memory = memory
        elif storage == "buffer":
            self.memory = Buffer(device, needed, placement)
        else:
            vk, _, _ = raw.load()
            self.memory = Image3D(device, texture_extent(self.shape), getattr(vk, info.vk_format),
                                  4 * info.itemsize, 2 if storage == "texture2d" else 3)

    @property
    def packed(self) -> bool:
        """True for a packed int8 layout (4W4C, 4C, 4C1W)."""
        return self.layout in layouts.PACKED_LAYOUTS

    @classmethod
    def empty(cls, shape, dtype: torch.dtype, storage: str = "buffer", label: str = "tensor",
              device=None, layout: str | None = None, placement: str = "auto") -> Tensor:
        """A device tensor whose contents are undefined (the memory may be recycled).

        Args:
            shape: sizes.
            dtype: float32, float16, int32, int8 or uint8.
            storage: "buffer", "texture3d" or "texture2d" (at most 2-D).
            label: what the tensor is, for error messages (e.g. "etvk.x.default: output 'out'").
            device: the `Device`; default `get_device()`.
            layout: None (the storage's default) or a packed int8 layout.
            placement: where a buffer's memory lives (memory.py's `Buffer`): "auto", or "host"
                for a result the host reads back (host-cached memory where the device has it).

        Raises:
            TensorTooLarge: over the device's limits for `storage`.
            UnsupportedDtype: another dtype.
            ValueError: a layout the shape, dtype or storage cannot have.
        """
        return cls(shape, dtype, storage, label, device, layout, placement=placement)

    @classmethod
    def zeros(cls, shape, dtype: torch.dtype, storage: str = "buffer", label: str = "tensor",
              device=None, layout: str | None = None) -> Tensor:
        """A zero-filled device tensor; arguments and errors as `Tensor.empty`."""
        tensor = cls(shape, dtype, storage, label, device, layout)
        if tensor.memory is not None:
            tensor.memory.zero()
        return tensor

    @classmethod
    def from_torch(cls, value: torch.Tensor, storage: str = "buffer", dtype: torch.dtype | None = None,
                   label: str = "tensor", device=None, layout: str | None = None) -> Tensor:
        """Upload a torch tensor (converted to `dtype` if given; packed if `layout` says so).

        Raises:
            TensorTooLarge: over the device's limits for `storage`.
            UnsupportedDtype: a dtype device tensors cannot hold.
            ValueError: a layout the shape, dtype or storage cannot have.
        """
        dtype = value.dtype if dtype is None else dtype
        tensor = cls(value.shape, dtype, storage, label, device, layout)
        tensor.copy_from(value)
        return tensor

    def copy_from(self, value: torch.Tensor) -> None:
        """Overwrite the contents with a torch tensor of the same shape (converted to this dtype,
        packed in this layout).

        Raises:
            ValueError: another shape.
        """
        if value.shape != self.shape:  # both torch.Size
            raise ValueError(f"cannot copy a tensor of shape {list(value.shape)} into {self!r}")
        if self.memory is None:
            return
        host = value  # a contiguous CPU tensor of this dtype outside autograd: copied from as it is
        if (value.dtype is not self.dtype or not value.is_cpu or value.requires_grad
                or not value.is_contiguous()):
            host = value.detach().to("cpu", self.dtype).contiguous()
        if self.packed:
            host = layouts.pack(host, self.layout)
            self.memory.write(host.data_ptr(), host.numel())
        elif self.storage == "buffer":
            self.memory.write(host.data_ptr(), host.numel() * host.element_size())
        else:
            width, height, depth = texture_extent(self.shape)
            texels = torch.zeros(depth, height, 4 * width, dtype=self.dtype)
            texels[..., : host.shape[-1] if host.dim() else 1] = host.reshape(depth, height, -1)
            self.memory.write(texels.data_ptr())

    def numel(self) -> int:
        """Number of elements."""
        return self.shape.numel()

    def dim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the logical values (numel x element size), as torch reports."""
        return self.numel() * dtype_info(self.dtype).itemsize

    def to_torch(self) -> torch.Tensor:
        """Download into a new contiguous CPU torch tensor."""
        if self.memory is None:
            return torch.empty(self.shape, dtype=self.dtype)
        if self.packed:
            words = torch.empty(4 * layouts.packed_words(self.shape, self.layout), dtype=torch.int8)
            self.memory.read(words.data_ptr(), words.numel())
            return layouts.unpack(words, self.shape, self.layout)
        if self.storage == "buffer":
            out = torch.empty(self.shape, dtype=self.dtype)
            self.memory.read(out.data_ptr(), out.nbytes)
            return out
        width, height, depth = texture_extent(self.shape)
        texels = torch.empty(depth, height, 4 * width, dtype=self.dtype)
        self.memory.read(texels.data_ptr())
        last = self.shape[-1] if self.dim() else 1
        return texels[..., :last].reshape(self.shape).contiguous()

    def to_torch_last(self, dim: int) -> torch.Tensor:
        """Download only the last index along `dim` (size 1 there): the bytes of that part alone
        when it is contiguous (a buffer whose dimensions before `dim` are all 1), else the whole
        tensor, narrowed."""
        shape = list(self.shape)
        if self.memory is None or self.packed or self.storage != "buffer" or math.prod(shape[:dim]) != 1:
            return self.to_torch().narrow(dim, shape[dim] - 1, 1).contiguous()
        out = torch.empty(shape[:dim] + [1] + shape[dim + 1:], dtype=self.dtype)
        self.memory.read(out.data_ptr(), out.nbytes, (shape[dim] - 1) * out.nbytes)
        return out

    def __repr__(self) -> str:
        return (f"Tensor(shape={list(self.shape)}, dtype={self.dtype}, storage={self.storage!r}, "
                f"layout={self.layout!r})")


class Constant:
    """A host tensor kept on devices: uploaded on first use per (device, dtype, storage), then reused.

    `Stream.upload` takes one wherever it takes a torch tensor. Weights are the
    typical constants: the op library's prepacked weights (`runtime.ops.prepack`)
    and a loaded program's constants.

    Args:
        value: the torch tensor (CPU); it must not change afterwards.
    """

    def __init__(self, value: torch.Tensor):
        self.value = value
        self._device_copies: dict[tuple, Tensor] = {}

    def on_device(self, device, dtype: torch.dtype, storage: str, label: str,
                  layout: str | None = None) -> Tensor:
        """The device `Tensor` of this value as `dtype` in `storage` (and `layout`), uploaded once."""
        key = (id(device), dtype, storage, layout)
        tensor = self._device_copies.get(key)
        if tensor is None or tensor.device is not device or device.closed:
            tensor = Tensor.from_torch(self.value, storage, dtype, label, device, layout)
            self._device_copies[key] = tensor
        return tensor
