"""Registers every op as ``torch.ops.etvk.<op>.<overload>``.

The CPU kernel is the op's PyTorch reference and the fake (meta) kernel is
the generated one, so ``torch.export`` can trace programs that use the ops
and graph passes can emit them. Called once by ``runtime/__init__.py``; it
must not touch Vulkan.
"""

from __future__ import annotations

import torch

from runtime.registry import get_op, list_ops
from runtime.shaders import ManifestError

_LIBRARY: torch.library.Library | None = None


def register_torch_ops() -> None:
    """Defines the ``etvk`` torch library from the registry (idempotent).

    Without a manifest (``generated/`` not written yet) nothing is registered;
    `get_op` then raises the `ManifestError` that says how to generate it.
    """
    global _LIBRARY
    if _LIBRARY is not None:
        return
    try:
        names = list_ops()
    except ManifestError:
        return
    library = torch.library.Library("etvk", "DEF")
    for name in names:
        op = get_op(name)
        qualified = op.schema.split("(", 1)[0]
        library.define(op.schema)
        library.impl(qualified, op.reference, "CPU")
        torch.library.register_fake(f"etvk::{qualified}", op.opdef.fake, lib=library)
    _LIBRARY = library
