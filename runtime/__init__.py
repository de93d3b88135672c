"""etvk runtime: run generated Vulkan compute shaders on torch tensors.

Public API (OPS.md "Public contract")::

    import runtime
    op = runtime.get_op("etvk.quantize_per_tensor.default")
    q = op(x, 0.05, 3, -128, 127, torch.int8)
    op.variants
    runtime.list_ops()
    runtime.load_ops("my_ops/generated")   # ops generated from a folder of one's own

    program = runtime.lower(exported_program)   # a quantized torch.export program
    program.save("model.etvk")
    loaded = runtime.load("model.etvk")         # on the default device
    outputs = loaded(*inputs)

Importing the package registers ``torch.ops.etvk.*`` (reference CPU kernels
and fake kernels) but opens no Vulkan device; the first op call does.

Layers (each imports only those above it in this list): `runtime.errors`;
`runtime.vulkan` (instance, device, memory, tensors, pipelines, streams);
`runtime.families` and `runtime.reference` (host-side rules and PyTorch
definitions of each op family); `runtime.ops` (shader libraries, the
registry, what generated stubs call, the measured conv choices); `runtime.pytorch`
(``torch.ops.etvk``, graph passes); `runtime.programs` (lowered models: lower,
save, load, run); `runtime.tools` (``python -m runtime``, the demo, examples,
the conv tuner).
"""

from pathlib import Path

from runtime.errors import (
    ArgumentError,
    ArgumentTypeError,
    EtvkError,
    TensorTooLarge,
    UnsupportedVariant,
    VulkanError,
    VulkanUnavailable,
)
from runtime.families.int4 import pack_int4, unpack_int4
from runtime.ops import registry
from runtime.ops.library import ManifestError
from runtime.ops.registry import Op, get_op, list_ops
from runtime.programs.generate import generate
from runtime.programs.loader import LoadedProgram, load
from runtime.programs.lower import lower
from runtime.programs.program import Program
from runtime.pytorch.torch_ops import register_torch_ops
from runtime.vulkan.stream import Stream


def load_ops(folder: Path | str) -> list[str]:
    """Serves the ops of a generated folder of one's own next to the built-in ones.

    The folder is what ``python -m codegen generate --specs DIR --templates DIR
    --out FOLDER`` wrote; its ops become callable through `get_op` and as
    ``torch.ops.etvk.*``.

    Returns:
        The names of the ops it added, sorted.

    Raises:
        ManifestError: the folder is unreadable, of another format, already
            loaded, or one of its op or variant names is already registered
            (the message names both sources).
    """
    names = registry.load_ops(folder)
    register_torch_ops()
    return names


register_torch_ops()

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "EtvkError",
    "LoadedProgram",
    "ManifestError",
    "Op",
    "Program",
    "Stream",
    "TensorTooLarge",
    "UnsupportedVariant",
    "VulkanError",
    "VulkanUnavailable",
    "generate",
    "get_op",
    "list_ops",
    "load",
    "load_ops",
    "lower",
    "pack_int4",
    "unpack_int4",
]
