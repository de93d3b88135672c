"""The shader library: generated/manifest.json and the SPIR-V cache.

Reads the manifest (docs/internals.md section 3) into frozen records, returns
SPIR-V from `<cache>/spv/<key>.spv` and compiles missing binaries on demand
through `codegen.glslc.ensure_spirv`. Decides whether a variant can run on a
device. It must not touch Vulkan objects (pipeline.py builds those) and never
edits generated files. Called by the registry, the op stubs, pipeline.py,
command.py and `python -m runtime info`.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import EtvkError
from runtime.tensor import IMAGE_STORAGES

IMAGE_FORMAT_OF_DTYPE = {"float32": "rgba32f", "float16": "rgba16f", "int32": "rgba32i",
                         "int8": "rgba8i", "uint8": "rgba8ui"}


class ManifestError(EtvkError, RuntimeError):
    """The generated manifest or SPIR-V cache is missing, stale or malformed."""


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
    """A variant's ABI: workgroup size, bindings, push constants (fields + size), spec constants."""

    workgroup: tuple
    bindings: tuple
    push_constants: tuple
    push_constants_size: int
    spec_constants: tuple


@dataclass(frozen=True)
class VariantInfo:
    """One generated shader variant as the manifest describes it."""

    name: str
    shader: str
    ops: tuple
    axes: dict
    requires: tuple
    spirv_key: str
    glsl: Path
    spec: str
    interface: Interface

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


def default_generated_dir() -> Path:
    """`ETVK_GENERATED_DIR`, else the `generated` folder next to the `runtime` package."""
    return Path(os.environ.get("ETVK_GENERATED_DIR") or Path(__file__).resolve().parents[1] / "generated")


def cache_dir() -> Path:
    """`ETVK_CACHE_DIR`, else `~/.cache/etvk` (SPIR-V under `spv/`, pipeline caches under `pipelines/`)."""
    return Path(os.environ.get("ETVK_CACHE_DIR") or Path.home() / ".cache" / "etvk")


def _variant_info(name: str, entry: dict, root: Path) -> VariantInfo:
    iface = entry["interface"]
    push = iface.get("push_constants", {"size": 0, "fields": []})
    return VariantInfo(
        name=name, shader=entry["shader"], ops=tuple(entry["ops"]), axes=dict(entry["axes"]),
        requires=tuple(entry.get("requires", ())), spirv_key=entry["spirv"],
        glsl=root / entry["glsl"], spec=entry["spec"],
        interface=Interface(
            workgroup=tuple(iface["workgroup"]),
            bindings=tuple(BindingInfo(b["name"], b["binding"], b["storage"], b["dtype"],
                                       b.get("vec", 4), b["access"]) for b in iface["bindings"]),
            push_constants=tuple(PushField(f["name"], f["type"], f["offset"]) for f in push["fields"]),
            push_constants_size=push["size"],
            spec_constants=tuple(SpecConstant(s["name"], s["id"], s["type"], s["default"])
                                 for s in iface.get("spec_constants", ()))))


class ShaderLibrary:
    """Every generated variant, and their SPIR-V.

    Args:
        root: the generated folder holding manifest.json; default
            `default_generated_dir()`.

    Raises:
        ManifestError: no readable manifest in `root`.
    """

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_generated_dir()
        path = self.root / "manifest.json"
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ManifestError(f"cannot read {path} ({exc}); run `python -m codegen generate`") from None
        self.spirv_flags = tuple(manifest["spirv_flags"])
        self._ops = manifest["ops"]
        self._variants = {n: _variant_info(n, e, self.root) for n, e in manifest["variants"].items()}

    def variant(self, name: str) -> VariantInfo:
        """Return the variant called `name`.

        Raises:
            KeyError: no such variant.
        """
        try:
            return self._variants[name]
        except KeyError:
            raise KeyError(f"no shader variant {name!r} in {self.root / 'manifest.json'}") from None

    def variants(self) -> list[VariantInfo]:
        """Every variant, sorted by name."""
        return [self._variants[n] for n in sorted(self._variants)]

    def ops(self) -> dict:
        """The manifest's op table: op name -> {family, schema, doc, reference, module, spec, variants}."""
        return self._ops

    def spirv(self, name: str) -> bytes:
        """Return the SPIR-V of variant `name`, compiling it into the cache if missing.

        Raises:
            ManifestError: the GLSL no longer matches the manifest's key (stale
                generated/), or codegen is unavailable to compile a missing binary.
            codegen.glslc.CompileError: glslc failed.
        """
        info = self.variant(name)
        cache = cache_dir()
        path = cache / "spv" / f"{info.spirv_key}.spv"
        if not path.exists():
            glsl = info.glsl.read_text()
            key = hashlib.sha256((" ".join(self.spirv_flags) + "\n" + glsl).encode()).hexdigest()
            if key != info.spirv_key:
                raise ManifestError(f"{info.glsl} does not match {self.root / 'manifest.json'}: "
                                    "run `python -m codegen generate`")
            try:
                from codegen.glslc import ensure_spirv
            except ImportError as exc:
                raise ManifestError(f"{path} is missing and codegen cannot compile it ({exc})") from None
            path = ensure_spirv([(info.spirv_key, glsl, f"{name} ({info.glsl})")], cache)[info.spirv_key]
        return Path(path).read_bytes()

    def runnable(self, variant: VariantInfo, caps) -> tuple[bool, str]:
        """Whether `variant` can run on a device with capabilities `caps`.

        Returns:
            `(True, "")`, or `(False, reason)` naming the missing capabilities
            or storage-image formats.
        """
        missing = [r for r in variant.requires if not caps.supports(r)]
        formats = sorted({IMAGE_FORMAT_OF_DTYPE[b.dtype] for b in variant.interface.bindings
                          if b.storage in IMAGE_STORAGES})
        missing += [f"storage images of {f}" for f in formats if not caps.supports_storage_image(f)]
        if missing:
            return False, f"{caps.name} lacks " + ", ".join(missing)
        return True, ""


_libraries: dict[str | None, ShaderLibrary] = {}  # by $ETVK_GENERATED_DIR, read per call


def get_library() -> ShaderLibrary:
    """Return the process-wide library of `default_generated_dir()` (one per $ETVK_GENERATED_DIR)."""
    key = os.environ.get("ETVK_GENERATED_DIR")
    if key not in _libraries:
        _libraries[key] = ShaderLibrary(default_generated_dir())
    return _libraries[key]
