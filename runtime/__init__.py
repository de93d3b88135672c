"""etvk runtime: run generated Vulkan compute shaders on torch tensors.

Public API (OPS.md "Public contract")::

    import runtime
    op = runtime.get_op("etvk.quantize_per_tensor.default")
    q = op(x, 0.05, 3, -128, 127, torch.int8)
    op.variants
    runtime.list_ops()

Importing the package registers ``torch.ops.etvk.*`` (reference CPU kernels
and fake kernels) but opens no Vulkan device; the first op call does.
"""

from runtime.errors import (
    ArgumentError,
    ArgumentTypeError,
    EtvkError,
    TensorTooLarge,
    UnsupportedVariant,
    VulkanError,
    VulkanUnavailable,
)
from runtime.int4 import pack_int4, unpack_int4
from runtime.registry import Op, get_op, list_ops
from runtime.torch_ops import register_torch_ops

register_torch_ops()

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "EtvkError",
    "Op",
    "TensorTooLarge",
    "UnsupportedVariant",
    "VulkanError",
    "VulkanUnavailable",
    "get_op",
    "list_ops",
    "pack_int4",
    "unpack_int4",
]
