"""Shader libraries: generated folders (manifest, stubs, SPIR-V), and the catalog of all of them.

A generated folder is what ``python -m codegen generate`` writes
(docs/internals.md section 3): ``manifest.json``, ``ops/<family>.py`` stubs,
``spv/<key>.spv`` binaries and, in a checkout, ``glsl/``. `ShaderLibrary`
reads one folder's manifest into frozen records and refuses a folder of
another format version; `VariantInfo.spirv()` reads a variant's binary and
names the variant and the command that fixes a missing or stale one.

The `Catalog` holds every library the process serves: the built-in one (the
package's ``_generated`` folder in an installed wheel, the checkout's
``generated/`` otherwise), the folders listed in ``ETVK_GENERATED_DIR``
(``os.pathsep``-separated) and those added by `runtime.load_ops`. Op and
variant names are global, so a clash is refused naming both sources.

It never imports codegen, compiles shaders or touches Vulkan objects.
Called by the registry, the op stubs (through stub_support), tools and tests.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from runtime.errors import EtvkError
from runtime.vulkan.interface import (
    IMAGE_STORAGES,
    BindingInfo,
    Interface,
    PushField,
    SpecConstant,
)
from runtime.vulkan.tensor import dtype_info

FORMAT = 2  # the generated-folder format this runtime reads (manifest + stub protocol)
MANIFEST = "manifest.json"
_PACKAGE = Path(__file__).resolve().parents[1]  # the `runtime` package folder


class ManifestError(EtvkError, RuntimeError):
    """A generated folder is missing, stale, malformed, of another format, or clashes with another."""


def builtin_dir() -> Path:
    """The built-in generated folder: ``runtime/_generated`` in a wheel, else the checkout's ``generated``."""
    packaged = _PACKAGE / "_generated"
    return packaged if (packaged / MANIFEST).exists() else _PACKAGE.parent / "generated"


@cache
def manifest_hash() -> str:
    """sha256 of the built-in manifest: it names every variant's SPIR-V hash, so it changes
    whenever a shader does (saved programs record it; measured tuning choices are keyed by it)."""
    return hashlib.sha256((builtin_dir() / MANIFEST).read_bytes()).hexdigest()


def _command(verb: str, root: Path) -> str:
    return f"`python -m codegen {verb} --out {root}`" + (
        " (`make generate` in a checkout)" if root == _PACKAGE.parent / "generated" else "")


@dataclass(frozen=True)
class VariantInfo:
    """One generated shader variant as its manifest describes it (a `runtime.vulkan.interface.Kernel`)."""

    name: str
    shader: str
    ops: tuple
    axes: dict
    requires: tuple
    spirv_key: str
    spec: str
    interface: Interface
    root: Path = field(repr=False)  # the generated folder
    glsl: Path = field(repr=False)  # may be absent (an installed wheel ships no GLSL)
    spirv_flags: tuple = field(repr=False)

    def binding(self, name: str) -> BindingInfo:
        """Return the binding called `name`.

        Raises:
            KeyError: the variant has no such binding; the message lists its bindings.
        """
        for b in self.interface.bindings:
            if b.name == name:
                return b
        known = ", ".join(b.name for b in self.interface.bindings)
        raise KeyError(f"variant {self.name} has no binding {name!r}; its bindings: {known}")

    def own_push(self, values: dict) -> dict:
        """``values`` without the push constants this variant does not declare (a step's
        stub computes those of all its variants, some of which are conditional)."""
        names = {f.name for f in self.interface.push_constants}
        return {name: value for name, value in values.items() if name in names}

    @property
    def spirv_path(self) -> Path:
        """Where the variant's SPIR-V lives: ``<folder>/spv/<key>.spv``."""
        return self.root / "spv" / f"{self.spirv_key}.spv"

    def spirv(self) -> bytes:
        """The variant's SPIR-V.

        Raises:
            ManifestError: the binary is missing, or the folder's GLSL no longer
                matches the manifest (edited after generation); the message names
                the variant and the command that fixes it.
        """
        if self.glsl.exists():
            text = self.glsl.read_text(encoding="utf-8")
            key = hashlib.sha256((" ".join(self.spirv_flags) + "\n" + text).encode()).hexdigest()
            if key != self.spirv_key:
                raise ManifestError(f"variant {self.name}: {self.glsl} does not match "
                                    f"{self.root / MANIFEST} (edited after generation): run "
                                    f"{_command('generate', self.root)}")
        try:
            return self.spirv_path.read_bytes()
        except OSError:
            raise ManifestError(f"variant {self.name} has no SPIR-V ({self.spirv_path} is missing): "
                                f"run {_command('compile', self.root)}") from None

    def runnable(self, caps) -> tuple[bool, str]:
        """Whether this variant can run on a device with capabilities `caps`.

        Returns:
            `(True, "")`, or `(False, reason)` naming the missing capabilities
            or storage-image formats.
        """
        missing = [r + (f" ({caps.why_not(r)})" if caps.why_not(r) else "")
                   for r in self.requires if not caps.supports(r)]
        formats = sorted({dtype_info(b.dtype).image_format for b in self.interface.bindings
                          if b.storage in IMAGE_STORAGES})
        missing += [f"storage images of {f}" for f in formats if not caps.supports_storage_image(f)]
        if missing:
            return False, f"{caps.name} lacks " + ", ".join(missing)
        return True, ""


def _interface(entry: dict) -> Interface:
    push = entry.get("push_constants", {"size": 0, "fields": []})
    return Interface(
        workgroup=tuple(entry["workgroup"]),
        bindings=tuple(BindingInfo(b["name"], b["binding"], b["storage"], b["dtype"],
                                   b.get("vec", 4), b["access"]) for b in entry["bindings"]),
        push_constants=tuple(PushField(f["name"], f["type"], f["offset"]) for f in push["fields"]),
        push_constants_size=push["size"],
        spec_constants=tuple(SpecConstant(s["name"], s["id"], s["type"], s["default"])
                             for s in entry.get("spec_constants", ())))


class ShaderLibrary:
    """One generated folder: its ops, variants and SPIR-V.

    Args:
        root: the folder holding manifest.json; default `builtin_dir()`.

    Raises:
        ManifestError: no readable manifest in `root`, or one of another format.
    """

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else builtin_dir()
        path = self.root / MANIFEST
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            found = manifest.get("format")
        except (OSError, ValueError, AttributeError) as exc:
            raise ManifestError(f"cannot read {path} ({exc}); run `python -m codegen generate`") from None
        if found != FORMAT:
            raise ManifestError(
                f"{path} has format {found!r} (generator: {manifest.get('generator', 'unknown')}); this "
                f"runtime reads format {FORMAT}: regenerate it with this toolkit's "
                f"`python -m codegen generate --out {self.root}`")
        try:
            self.spirv_flags = tuple(manifest["spirv_flags"])
            self._ops = manifest["ops"]
            self._variants = {n: self._variant(n, e) for n, e in manifest["variants"].items()}
        except (KeyError, TypeError) as exc:
            raise ManifestError(f"{path} is malformed (missing {exc}); run `python -m codegen generate`") \
                from None

    def _variant(self, name: str, entry: dict) -> VariantInfo:
        return VariantInfo(
            name=name, shader=entry["shader"], ops=tuple(entry["ops"]), axes=dict(entry["axes"]),
            requires=tuple(entry.get("requires", ())), spirv_key=entry["spirv"], spec=entry["spec"],
            interface=_interface(entry["interface"]), root=self.root, glsl=self.root / entry["glsl"],
            spirv_flags=self.spirv_flags)

    def __repr__(self) -> str:
        return f"<ShaderLibrary {self.root}: {len(self._ops)} ops, {len(self._variants)} variants>"

    def variant(self, name: str) -> VariantInfo:
        """Return the variant called `name`.

        Raises:
            KeyError: no such variant.
        """
        try:
            return self._variants[name]
        except KeyError:
            raise KeyError(f"no shader variant {name!r} in {self.root / MANIFEST}") from None

    def variants(self) -> list[VariantInfo]:
        """Every variant, sorted by name."""
        return [self._variants[n] for n in sorted(self._variants)]

    def ops(self) -> dict:
        """The manifest's op table: op name -> {family, schema, doc, reference, module, spec, variants}."""
        return self._ops

    def source(self, op: str | None = None) -> str:
        """Where an op (or the library) comes from, for messages: ``<manifest> (<spec file:line>)``."""
        where = str(self.root / MANIFEST)
        return f"{where} ({self._ops[op]['spec']})" if op in self._ops else where


class Catalog:
    """Every shader library the process serves; op and variant names are unique across them."""

    def __init__(self, libraries=()):
        self.libraries: list[ShaderLibrary] = []
        self._variants: dict[str, VariantInfo] = {}
        self._op_library: dict[str, ShaderLibrary] = {}
        for library in libraries:
            self.add(library)

    def check(self, library: ShaderLibrary) -> None:
        """Raises `ManifestError` unless `library` can be added: not loaded yet, and none of
        its op or variant names already served (the message names both sources)."""
        if any(known.root.resolve() == library.root.resolve() for known in self.libraries):
            raise ManifestError(f"{library.root} is already loaded")
        for op in library.ops():
            other = self._op_library.get(op)
            if other is not None:
                raise ManifestError(f"op {op} from {library.source(op)} clashes with the registered "
                                    f"{op} from {other.source(op)}: rename one of them")
        for variant in library.variants():
            other = self._variants.get(variant.name)
            if other is not None:
                raise ManifestError(
                    f"variant {variant.name} from {library.source()} ({variant.spec}) clashes with the "
                    f"variant of that name from {other.root / MANIFEST} ({other.spec}): rename a shader")

    def add(self, library: ShaderLibrary) -> ShaderLibrary:
        """Serve `library` too.

        Raises:
            ManifestError: see `check`.
        """
        self.check(library)
        self.libraries.append(library)
        self._op_library.update(dict.fromkeys(library.ops(), library))
        self._variants.update((v.name, v) for v in library.variants())
        return library

    def variant(self, name: str) -> VariantInfo:
        """The variant called `name`, from whichever library serves it.

        Raises:
            KeyError: no library has it.
        """
        try:
            return self._variants[name]
        except KeyError:
            raise KeyError(f"no shader variant {name!r} in "
                           f"{', '.join(str(lib.root / MANIFEST) for lib in self.libraries)}") from None

    def variants(self) -> list[VariantInfo]:
        """Every variant of every library, sorted by name."""
        return [self._variants[n] for n in sorted(self._variants)]


_catalog: Catalog | None = None


def environment_dirs() -> list[Path]:
    """The folders listed in ``ETVK_GENERATED_DIR`` (``os.pathsep``-separated; empty entries skipped)."""
    return [Path(p) for p in os.environ.get("ETVK_GENERATED_DIR", "").split(os.pathsep) if p]


def catalog() -> Catalog:
    """The process-wide catalog: the built-in library, then ``ETVK_GENERATED_DIR``'s folders.

    Made on first use; a failure is raised again on the next call (nothing is cached).

    Raises:
        ManifestError: a folder is unreadable, of another format, or clashes.
    """
    global _catalog
    if _catalog is None:
        _catalog = Catalog([ShaderLibrary(builtin_dir()), *map(ShaderLibrary, environment_dirs())])
    return _catalog
