"""Per-channel tables' integer affine maps kept on disk: `packed_affine_channels`.

Fitting the maps (`runtime.families.channel_affine`) costs ~15 ms a table on one core, 1.7 s
for DenseNet-121's 112 tables, each time a program loads, and the maps depend on the table
alone. A fit is kept in ``<cache>/affine/<key>.i64`` (`cache_dir()`: ``ETVK_CACHE_DIR``, next
to the pipeline cache), its ``[C, 5]`` int64 values raw in little-endian order, the key the
SHA-256 of the table's shape and bytes. A file found is used only after
`check_affine_channels` has found it exact for every entry of the table (~1 ms a table), so a
damaged or foreign file costs a refit, never a wrong byte. Tables no map fits are not kept
(refusing is fast: the search stops at an empty range). Writes are atomic (a temporary file
renamed over the name); a cache that cannot be written is skipped with a warning. Called by
runtime/ops/stub_support.py (the spec helper `affine_channels`, through `prepacked`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import warnings
from pathlib import Path

import torch

from runtime.families.channel_affine import check_affine_channels, fit_affine_channels, pack_fit
from runtime.vulkan.pipeline import cache_dir


def _path(table: torch.Tensor) -> Path:
    digest = hashlib.sha256(repr(tuple(table.shape)).encode())
    digest.update(table.contiguous().numpy().tobytes())
    return cache_dir() / "affine" / f"{digest.hexdigest()}.i64"


def _read(path: Path, table: torch.Tensor) -> torch.Tensor | None:
    """The exact fit in `path`, else None (no file, or one that does not hold one)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) != table.shape[0] * 5 * 8:
        return None
    fit = torch.frombuffer(bytearray(data), dtype=torch.int64).view(-1, 5)
    return fit if check_affine_channels(fit, table) else None


def _write(path: Path, fit: torch.Tensor) -> None:
    """`fit` into `path` through a temporary file renamed over it (as the pipeline cache and the
    tuning file are written); a warning where it cannot be written."""
    temporary = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_bytes(fit.contiguous().numpy().astype("<i8").tobytes())
        temporary.replace(path)
    except OSError as e:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        warnings.warn(f"the affine maps' cache {path.parent} cannot be written ({type(e).__name__}); "
                      "such tables are fitted at every load", stacklevel=2)


def cached_affine_channels(table: torch.Tensor) -> torch.Tensor | None:
    """`fit_affine_channels(table)`, read from the cache where it holds an exact fit, else
    fitted and, where a map fits, written there."""
    path = _path(table)
    fit = _read(path, table)
    if fit is None:
        fit = fit_affine_channels(table)
        if fit is not None:
            _write(path, fit)
    return fit


def packed_affine_channels(table: torch.Tensor) -> torch.Tensor:
    """The shaders' words of the table's maps (`pack_fit`) from `cached_affine_channels`: an
    empty int8 tensor where no map fits every channel."""
    return pack_fit(cached_affine_channels(table))
