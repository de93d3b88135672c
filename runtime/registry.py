"""The op registry: ``get_op("etvk.<op>.<overload>")`` and ``list_ops()``.

It loads the generated stub modules named by the manifest (no Vulkan needed
for that) and wraps each `OpDef` in an `Op`: a callable that takes torch
tensors, records the stub into a fresh `Stream`, runs it and returns torch
tensors. Validation and variant choice live in the stubs and `stub_support`;
recording lives in `command`; this module only connects them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path

from runtime.stub_support import OpDef


class Op:
    """One registered op, e.g. ``etvk.quantize_per_tensor.default``.

    Call it like the PyTorch op of the same schema, with two extra keywords:
    ``variant=`` forces a generated variant and ``storage=`` states a
    preference ("buffer" or "texture3d").
    """

    def __init__(self, opdef: OpDef):
        self.opdef = opdef
        self.name = opdef.name
        self.schema = opdef.schema
        self.doc = opdef.doc

    def __repr__(self) -> str:
        return f"<Op {self.name}: {len(self.opdef.variants)} variants>"

    @property
    def variants(self):
        """Every generated variant of this op (`runtime.shaders.VariantInfo`, with axis values)."""
        from runtime.shaders import get_library

        library = get_library()
        return [library.variant(name) for name, _ in self.opdef.variants]

    @property
    def reference(self):
        """The PyTorch reference function that defines this op's numerics."""
        module, _, function = self.opdef.reference.partition(":")
        return getattr(importlib.import_module(module), function)

    def record(self, stream, *args, **kwargs):
        """Records the op into ``stream`` and returns its device tensors (no host round trip)."""
        return self.opdef.record(stream, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        from runtime.command import Stream

        with Stream() as stream:
            outputs = self.opdef.record(stream, *args, **kwargs)
            stream.run()
            if isinstance(outputs, tuple):
                return tuple(t.to_torch() for t in outputs)
            return outputs.to_torch()


def _load_module(path: Path):
    name = f"etvk_generated.{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@cache
def _ops() -> dict[str, Op]:
    from runtime.shaders import get_library

    library = get_library()
    ops: dict[str, Op] = {}
    for module_path in sorted({entry["module"] for entry in library.ops().values()}):
        for opdef in _load_module(library.root / module_path).OPS:
            ops[opdef.name] = Op(opdef)
    return ops


def list_ops() -> list[str]:
    """Every registered op name, sorted (``etvk.<op>.<overload>``)."""
    return sorted(_ops())


def get_op(name: str) -> Op:
    """Returns the op registered as ``name``.

    Raises:
        KeyError: no such op; the message lists the registered ones.
    """
    ops = _ops()
    if name not in ops:
        raise KeyError(f"no op named {name!r}; registered ops: {', '.join(sorted(ops))}")
    return ops[name]
