"""The op registry: ``get_op("etvk.<op>.<overload>")``, ``list_ops()`` and ``load_ops(folder)``.

It loads the generated stub modules of every library in the catalog
(`runtime.ops.library`; no Vulkan needed for that) and wraps each `OpDef` in
an `Op`: a callable that takes torch tensors, records the stub into a fresh
`Stream` (or replays the call plan of an earlier call with the same key:
`runtime.ops.plans`), runs it and returns torch tensors. Validation and
variant choice live in the stubs and `stub_support`; recording lives in the
Vulkan layer's stream; this module only connects them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from runtime.ops.library import Catalog, ManifestError, ShaderLibrary, catalog
from runtime.ops.plans import plans_for
from runtime.ops.stub_support import OpDef
from runtime.vulkan.device import get_device


class Op:
    """One registered op, e.g. ``etvk.quantize_per_tensor.default``.

    Call it like the PyTorch op of the same schema, with two extra keywords:
    ``variant=`` forces a generated variant and ``storage=`` states a
    preference ("buffer" or "texture3d").
    """

    def __init__(self, opdef: OpDef, library: ShaderLibrary):
        self.opdef = opdef
        self.library = library
        self.name = opdef.name
        self.schema = opdef.schema
        self.doc = opdef.doc

    def __repr__(self) -> str:
        return f"<Op {self.name}: {len(self.opdef.variants)} variants>"

    @property
    def variants(self):
        """Every generated variant of this op (`runtime.ops.library.VariantInfo`, with axis values)."""
        return [catalog().variant(name) for name, _ in self.opdef.variants]

    @property
    def reference(self):
        """The PyTorch reference function that defines this op's numerics."""
        module, _, function = self.opdef.reference.partition(":")
        return getattr(importlib.import_module(module), function)

    def record(self, stream, *args, **kwargs):
        """Records the op into ``stream`` and returns its device tensors (no host round trip)."""
        return self.opdef.record(stream, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        device = get_device()
        with device.lock:  # calls from several threads take turns
            return plans_for(device).call(self.opdef, device, args, kwargs)


def _load_module(library: ShaderLibrary, index: int, relative: str):
    """Import one stub module of `library` under a name unique to the library."""
    path = library.root / relative
    name = f"etvk_generated.lib{index}_{Path(relative).stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.exists():
        raise ManifestError(f"{path} is missing (listed in {library.source()}); "
                            "run `python -m codegen generate`")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _library_ops(library: ShaderLibrary, index: int) -> dict[str, Op]:
    ops = {}
    for relative in sorted({entry["module"] for entry in library.ops().values()}):
        for opdef in _load_module(library, index, relative).OPS:
            ops[opdef.name] = Op(opdef, library)
    return ops


_OPS: dict[str, Op] = {}
_LOADED: list[ShaderLibrary] = []  # the catalog's libraries whose modules are in _OPS


def _ops(source: Catalog | None = None) -> dict[str, Op]:
    """Every op of the catalog, loading the stub modules of libraries not loaded yet."""
    source = source or catalog()
    for index, library in enumerate(source.libraries):
        if index >= len(_LOADED):
            _OPS.update(_library_ops(library, index))
            _LOADED.append(library)
    return _OPS


def list_ops() -> list[str]:
    """Every registered op name, sorted (``etvk.<op>.<overload>``)."""
    return sorted(_ops())


def get_op(name: str) -> Op:
    """Returns the op registered as ``name``.

    Raises:
        KeyError: no such op; the message lists the registered ones.
        ManifestError: a generated folder is unreadable, of another format, or clashes.
    """
    ops = _ops()
    if name not in ops:
        raise KeyError(f"no op named {name!r}; registered ops: {', '.join(sorted(ops))}")
    return ops[name]


def load_ops(folder: Path | str) -> list[str]:
    """Serves the ops of a generated folder next to those already registered.

    Args:
        folder: what ``python -m codegen generate --out DIR`` wrote (with its
            ``spv/`` compiled).

    Returns:
        The names of the ops it added, sorted.

    Raises:
        ManifestError: the folder is unreadable or of another format, already
            loaded, or one of its op or variant names is already registered
            (the message names both sources).
    """
    source = catalog()
    _ops(source)
    library = ShaderLibrary(folder)
    source.check(library)
    added = _library_ops(library, len(source.libraries))  # imports first: a broken stub adds nothing
    source.add(library)
    _OPS.update(added)
    _LOADED.append(library)
    return sorted(added)
