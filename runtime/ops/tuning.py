"""Measured conv choices on disk, and the lookup the conv op specs make through `tuned`.

The file is ``<cache>/tuning/conv2d.json`` (`cache_dir()`: ``ETVK_CACHE_DIR``,
next to the pipeline cache):

    {"version": 1,
     "devices": {"<vendor>:<device> <name> driver <version> shaders <hash>": {
         "<shape key>": {"pw": <choice>, "im2col": <choice>, ...}}}}

with one `Conv2dChoice.to_json` object per algorithm the tuner measured for
that conv geometry (`shape_key`: N, C_in, H, W, C_out, kernel, stride,
padding, dilation, groups), its fastest layout and settings. A measurement
belongs to one device, driver and build of the shaders (the first 12 hex of
`manifest_hash`): after a shader changes, `python -m runtime tune` measures
again and the rule stands until then. The winner of a
shape is its fastest algorithm. Writes are atomic (a temporary file renamed
over the old one) and merge with what the file holds by then. A file that
cannot be read or parsed, has another version, or holds an entry that is not
a valid choice is ignored with a warning (that entry, or all of it), never
an error. ``ETVK_TUNING=off`` ignores the file: every conv follows its rule.

`forcing` makes `lookup` answer one choice whatever the file says: the
tuner times candidates with it, tests run every candidate with it.
`rules_only` makes it answer None, as ``ETVK_TUNING=off`` does, within a
block: the tune command loads a program by the rules with it, to time it
against the same program with the measured choices. This
module must not measure anything (runtime/tools/tuner.py does). Called by
stub_support (the spec helpers), the program loader and the tuner.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import warnings
from pathlib import Path

from runtime.families.conv2d import Conv2dParams
from runtime.families.conv2d_tuning import Conv2dChoice, candidate_algorithms, choice_from_json
from runtime.ops.library import manifest_hash
from runtime.vulkan.device import get_device
from runtime.vulkan.pipeline import cache_dir

VERSION = 1
SWITCH = "ETVK_TUNING"  # "off": ignore measured choices


def cache_path() -> Path:
    """Where measured conv choices live: ``<cache>/tuning/conv2d.json``."""
    return cache_dir() / "tuning" / "conv2d.json"


def device_key(caps) -> str:
    """What a measurement belongs to: vendor and device id, name, driver version and shaders."""
    return (f"{caps.vendor_id:04x}:{caps.device_id:04x} {caps.name} driver {caps.driver_version:08x} "
            f"shaders {manifest_hash()[:12]}")


def shape_key(p: Conv2dParams) -> str:
    """The conv geometry a measurement belongs to, e.g. ``n1 c64x56x56 o64 k3x3 s1x1 p1x1 d1x1 g1``."""
    return (f"n{p.N} c{p.C_in}x{p.H}x{p.W} o{p.C_out} k{p.KH}x{p.KW} s{p.stride[0]}x{p.stride[1]} "
            f"p{p.padding[0]}x{p.padding[1]} d{p.dilation[0]}x{p.dilation[1]} g{p.groups}")


def enabled() -> bool:
    """False when ``ETVK_TUNING=off``."""
    return os.environ.get(SWITCH, "").strip().lower() != "off"


class TuningCache:
    """The choices file at `path`, read lazily and again whenever it changed on disk."""

    def __init__(self, path: Path):
        self.path = path
        self._stamp: tuple | None = None
        self._devices: dict[str, dict[str, dict[str, Conv2dChoice]]] = {}

    def _read(self) -> dict:
        """The file's devices as JSON, or {} (with a warning) when it is unusable."""
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            warnings.warn(f"{self.path}: ignoring the tuning cache, it cannot be read: {exc}", stacklevel=3)
            return {}
        if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(
                data.get("devices"), dict):
            version = data.get("version") if isinstance(data, dict) else None
            warnings.warn(f"{self.path}: ignoring the tuning cache: not a version {VERSION} file "
                          f"(version {version!r})", stacklevel=3)
            return {}
        return data["devices"]

    def _parse(self, devices: dict) -> dict:
        parsed = {}
        for device, shapes in devices.items():
            for shape, entry in (shapes.items() if isinstance(shapes, dict) else ()):
                try:
                    if not isinstance(entry, dict) or not entry:
                        raise ValueError(f"not an object of choices: {entry!r}")
                    choices = {alg: choice_from_json(c) for alg, c in entry.items()}
                    if any(c.algorithm != alg for alg, c in choices.items()):
                        raise ValueError("a choice filed under another algorithm")
                except ValueError as exc:
                    warnings.warn(f"{self.path}: ignoring the entry of {shape!r} on {device!r}: {exc}",
                                  stacklevel=4)
                    continue
                parsed.setdefault(device, {})[shape] = choices
        return parsed

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._devices = self._parse(self._read()) if stamp else {}
            self._stamp = stamp

    def choices(self, device: str, shape: str) -> dict[str, Conv2dChoice]:
        """algorithm -> its measured best choice for one device and conv geometry ({} if none)."""
        self._refresh()
        return self._devices.get(device, {}).get(shape, {})

    def store(self, device: str, shape: str, choices: dict[str, Conv2dChoice]) -> None:
        """Records the measured best choice per algorithm of one geometry, replacing its old entry
        (empty `choices`: removes the entry, so that the rule decides again).

        Raises:
            OSError: the file cannot be written.
        """
        devices = self._read()
        shapes = devices.setdefault(device, {})
        if choices:
            shapes[shape] = {alg: c.to_json() for alg, c in sorted(choices.items())}
        else:
            shapes.pop(shape, None)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        temporary.write_text(json.dumps({"version": VERSION, "devices": devices}, indent=1,
                                        sort_keys=True) + "\n")
        temporary.replace(self.path)
        self._stamp = None


_caches: dict[Path, TuningCache] = {}
_forced: contextvars.ContextVar[Conv2dChoice | None] = contextvars.ContextVar("forced", default=None)
_rules: contextvars.ContextVar[bool] = contextvars.ContextVar("rules", default=False)
_lock = threading.Lock()


def tuning_cache() -> TuningCache:
    """The `TuningCache` of the current `cache_path()`."""
    path = cache_path()
    with _lock:
        return _caches.setdefault(path, TuningCache(path))


@contextlib.contextmanager
def forcing(choice: Conv2dChoice):
    """Within the block (in this thread), `lookup` answers `choice` for every conv (its
    algorithm, layout and settings), whatever the file says and even with ``ETVK_TUNING=off``."""
    token = _forced.set(choice)
    try:
        yield
    finally:
        _forced.reset(token)


@contextlib.contextmanager
def rules_only():
    """Within the block (in this thread), `measured` answers {} as with ``ETVK_TUNING=off``: every
    conv follows its rule (a `forcing` choice still wins)."""
    token = _rules.set(True)
    try:
        yield
    finally:
        _rules.reset(token)


def measured(p: Conv2dParams) -> dict[str, Conv2dChoice]:
    """algorithm -> the measured best choice of that algorithm for `p` on this device ({} when
    nothing was measured, with ``ETVK_TUNING=off`` or within `rules_only`); only algorithms
    valid for `p`."""
    if not enabled() or _rules.get():
        return {}
    choices = tuning_cache().choices(device_key(get_device().caps), shape_key(p))
    return {a: c for a, c in choices.items() if a in candidate_algorithms(p)}


def lookup(p: Conv2dParams, algorithm: str | None = None) -> Conv2dChoice | None:
    """The choice to run `p` with: the forced one (`forcing`), else the measured best of
    `algorithm` (of any algorithm, the winner, when None), else None (the rule decides)."""
    forced = _forced.get()
    if forced is not None:
        return forced if algorithm in (None, forced.algorithm) else None
    choices = measured(p)
    if algorithm is not None:
        return choices.get(algorithm)
    return min(choices.values(), key=lambda c: c.seconds, default=None)
