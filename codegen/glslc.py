"""Compile GLSL to SPIR-V through a content-hash cache, in parallel, validating every binary.

The cache key is sha256(" ".join(SPIRV_FLAGS) + "\\n" + glsl_text); binaries
live at `<cache>/spv/<key>.spv` (cache = $ETVK_CACHE_DIR or ~/.cache/etvk).
`ensure_spirv` compiles only what is missing: the missing sources are split
into one batch per worker (one `glslc -c` process compiles a whole batch),
and every new binary is checked with `spirv-val` before it enters the cache.
Failures raise `CompileError` naming each item's label and line. Must not
know about specs or templates (the caller maps lines back). Called by
`build.py` and, on demand, by the runtime (keep `ensure_spirv`'s signature).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

SPIRV_FLAGS = ("--target-env=vulkan1.2", "-O")
VALIDATE_FLAGS = ("--target-env", "vulkan1.2")


@dataclass(frozen=True)
class CompileFailure:
    """One failed item: its label, the 1-based GLSL line (0 if unknown) and the message."""

    label: str
    key: str
    line: int
    message: str


class CompileError(Exception):
    """glslc or spirv-val rejected one or more shaders (or a tool is missing)."""

    def __init__(self, failures: list[CompileFailure]):
        self.failures = failures
        lines = [
            f"{f.label}:{f.line}: error: {f.message}"
            if f.line
            else f"{f.label}: error: {f.message}"
            for f in failures
        ]
        super().__init__("\n".join(lines))


def spirv_key(text: str) -> str:
    """The cache key of a GLSL source under `SPIRV_FLAGS`."""
    return hashlib.sha256((" ".join(SPIRV_FLAGS) + "\n" + text).encode("utf-8")).hexdigest()


def cache_dir() -> Path:
    """$ETVK_CACHE_DIR, or ~/.cache/etvk."""
    env = os.environ.get("ETVK_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "etvk"


def spirv_path(key: str, cache: Path) -> Path:
    """Where the binary of `key` lives in the cache."""
    return Path(cache) / "spv" / f"{key}.spv"


def ensure_spirv(
    items: list[tuple[str, str, str]], cache_dir: Path, *, progress: bool = False
) -> dict[str, Path]:
    """Makes sure every (key, glsl_text, label) has a validated binary in the cache.

    Args:
        items: (cache key from `spirv_key`, GLSL source, label used in errors).
        cache_dir: the cache root (see `cache_dir()`).
        progress: print `compiling N shaders (W workers)... n/N` on stderr.

    Returns:
        key -> path of the SPIR-V binary.

    Raises:
        CompileError: glslc or spirv-val failed for some items (all are reported).
    """
    cache = Path(cache_dir)
    paths = {key: spirv_path(key, cache) for key, _, _ in items}
    missing = list(
        {key: (key, text, label) for key, text, label in items if not paths[key].exists()}.values()
    )
    if not missing:
        return paths
    tools = [t for t in ("glslc", "spirv-val") if shutil.which(t) is None]
    if tools:
        raise CompileError(
            [
                CompileFailure(
                    label,
                    key,
                    0,
                    f"{' and '.join(tools)} not found on PATH; "
                    "install shaderc and spirv-tools (or fill the SPIR-V cache)",
                )
                for key, _, label in missing
            ]
        )
    (cache / "spv").mkdir(parents=True, exist_ok=True)
    workers = max(1, min(os.cpu_count() or 1, len(missing)))
    batches = [missing[i::workers] for i in range(workers)]
    done = [0]
    total = len(missing)

    tty = progress and sys.stderr.isatty()
    lock = threading.Lock()

    def tick(n: int) -> None:
        with lock:
            done[0] += n
            if tty or (progress and done[0] == total):
                end = "\n" if done[0] == total else ""
                lead = "\r" if tty else ""
                sys.stderr.write(
                    f"{lead}compiling {total} shaders ({workers} workers)... {done[0]}/{total}{end}"
                )
                sys.stderr.flush()

    if tty:
        tick(0)
    failures: list[CompileFailure] = []
    with (
        tempfile.TemporaryDirectory(prefix="etvk-glslc-") as tmp,
        ThreadPoolExecutor(workers) as pool,
    ):
        futures = [
            pool.submit(_compile_batch, batch, Path(tmp) / str(i), cache, tick)
            for i, batch in enumerate(batches)
            if batch
        ]
        for f in futures:
            failures += f.result()
    if failures:
        raise CompileError(sorted(failures, key=lambda f: (f.label, f.line)))
    return paths


_DIAG = re.compile(r"^(?P<file>[0-9a-f]{64})\.comp:(?:(?P<line>\d+):)?\s*(?P<msg>.*)$")


def _compile_batch(batch, workdir: Path, cache: Path, tick) -> list[CompileFailure]:
    workdir.mkdir(parents=True)
    for key, text, _ in batch:
        (workdir / f"{key}.comp").write_text(text, encoding="utf-8", newline="\n")
    labels = {key: label for key, _, label in batch}
    cmd = ["glslc", *SPIRV_FLAGS, "-c", *(f"{key}.comp" for key, _, _ in batch)]
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True)
    failures: list[CompileFailure] = []
    failed: set[str] = set()
    if proc.returncode != 0:
        for raw in (proc.stderr + proc.stdout).splitlines():
            m = _DIAG.match(raw.strip())
            if m and "error" in m.group("msg"):
                key = m.group("file")
                failed.add(key)
                msg = re.sub(r"^error:\s*", "", m.group("msg"))
                failures.append(
                    CompileFailure(labels[key], key, int(m.group("line") or 0), f"glslc: {msg}")
                )
        if not failures:  # an error we could not attribute: blame the whole batch
            text = (proc.stderr + proc.stdout).strip() or f"glslc exited with {proc.returncode}"
            return [CompileFailure(label, key, 0, f"glslc: {text}") for key, _, label in batch]
    for key, _, label in batch:
        if key in failed:
            continue
        out = workdir / f"{key}.comp.spv"
        if not out.exists():
            out = workdir / f"{key}.spv"
        val = subprocess.run(
            ["spirv-val", *VALIDATE_FLAGS, str(out)], capture_output=True, text=True
        )
        if val.returncode != 0:
            text = (val.stderr + val.stdout).strip().splitlines()
            failures.append(CompileFailure(label, key, 0, "spirv-val: " + " ".join(text[:3])))
            continue
        dest = spirv_path(key, cache)
        tmp = dest.with_suffix(f".tmp{os.getpid()}")
        shutil.copyfile(out, tmp)
        os.replace(tmp, dest)
    tick(len(batch))
    return failures
