"""Registers every op as ``torch.ops.etvk.<op>.<overload>``.

The CPU kernel is the op's PyTorch reference and the fake (meta) kernel is
the generated one, so ``torch.export`` can trace programs that use the ops
and graph passes can emit them. The reference module is imported on the
first CPU call, so a user op folder whose reference is not importable yet
still registers. Called by ``runtime/__init__.py`` at import and by
`runtime.load_ops`; it must not touch Vulkan.
"""

from __future__ import annotations

import importlib

import torch

from runtime.ops.library import ManifestError
from runtime.ops.registry import get_op, list_ops

_LIBRARIES: list[torch.library.Library] = []
_REGISTERED: set[str] = set()


def _reference_kernel(path: str):
    """A CPU kernel calling the reference ``module:function``, imported on first use."""
    module, _, name = path.partition(":")

    def kernel(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    kernel.__name__ = name
    return kernel


def register_torch_ops() -> list[str]:
    """Defines every registered op not yet in the ``etvk`` torch namespace.

    Without the built-in manifest (``generated/`` not written yet) nothing is
    registered; `get_op` then raises the `ManifestError` that says how to
    generate it.

    Returns:
        The op names it defined.
    """
    try:
        names = [name for name in list_ops() if name not in _REGISTERED]
    except ManifestError:
        return []
    if not names:
        return []
    library = torch.library.Library("etvk", "FRAGMENT" if _LIBRARIES else "DEF")
    for name in names:
        opdef = get_op(name).opdef
        qualified = opdef.schema.split("(", 1)[0]
        library.define(opdef.schema)
        library.impl(qualified, _reference_kernel(opdef.reference), "CPU")
        torch.library.register_fake(f"etvk::{qualified}", opdef.fake, lib=library)
        _REGISTERED.add(name)
    _LIBRARIES.append(library)
    return names
