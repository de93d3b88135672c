"""The ABI of a compute kernel as the Vulkan layer sees it, and the `Kernel` protocol.

A kernel is a SPIR-V compute shader plus its interface: the workgroup size,
the descriptor bindings (storage kind, dtype, access), the push-constant
fields with their byte offsets and the user specialization constants
(docs/internals.md sections 2 and 3 define them). The op library builds
these records from a manifest; pipeline.py, dispatch.py and stream.py consume
them. Plain frozen records: no Vulkan calls, no file access. Imported by the
whole Vulkan layer and by the op library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STORAGES = ("buffer", "texture3d", "texture2d")
IMAGE_STORAGES = ("texture3d", "texture2d")


@dataclass(frozen=True)
class BindingInfo:
    """One descriptor binding: name, binding number, storage, dtype, vec (4 or 1), access."""

    name: str
    binding: int
    storage: str
    dtype: str
    vec: int
    access: str


@dataclass(frozen=True)
class PushField:
    """One push-constant field: name, type (uint, int, float, ivec4, uvec4, vec4), byte offset."""

    name: str
    type: str
    offset: int


@dataclass(frozen=True)
class SpecConstant:
    """One user specialization constant: name, id (>= 3), type (int, uint, float, bool), default."""

    name: str
    id: int
    type: str
    default: object


@dataclass(frozen=True)
class Interface:
    """A kernel's ABI: workgroup size, bindings, push constants (fields + size), spec constants."""

    workgroup: tuple
    bindings: tuple
    push_constants: tuple
    push_constants_size: int
    spec_constants: tuple


class Kernel(Protocol):
    """What the Vulkan layer needs of a shader variant (`runtime.ops.library.VariantInfo` is one).

    ``spirv_key`` identifies the SPIR-V: pipelines and dispatch layouts are
    cached by ``(name, spirv_key)``.
    """

    name: str
    spirv_key: str
    interface: Interface

    def spirv(self) -> bytes:
        """The kernel's SPIR-V binary."""
