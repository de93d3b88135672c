"""The streaming floor: what a dispatch that only reads the same bytes takes on this device.

`read_op()` generates the op of one's own in benchmarks/read_kernel/ (``etvk.stream_read``, a
kernel that reads a buffer and stores nothing) into a temporary folder with codegen, which needs
glslc and spirv-val on PATH as `make setup` installs them, and loads it: ``(op, "")``, or
``(None, why)`` where it cannot be built. `read_buffers()` makes the distinct copies a
benchmark rotates over so that every read streams from memory rather than the L2.
linear_bench.py times it next to its one-token rows (benchmarks/NOTES.md, session 23).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import runtime
from runtime.vulkan.tensor import Tensor

FOLDER = Path(__file__).resolve().parent / "read_kernel"
OP = "etvk.stream_read.default"
# Invocations of one read dispatch (the kernel's grid stride). H100, 32 to 256 Ki: 128 Ki was
# within 2 % of the best at 9.4, 33 and 120 MB (benchmarks/NOTES.md, session 23).
INVOCATIONS = 128 * 1024


@functools.cache
def read_op():
    """(etvk.stream_read, "") once its folder is generated and loaded, or (None, why)."""
    out = Path(tempfile.mkdtemp(prefix="etvk-read-kernel-"))
    atexit.register(shutil.rmtree, out, True)
    command = [sys.executable, "-m", "codegen", "generate", "--specs", str(FOLDER / "op_specs"),
               "--templates", str(FOLDER / "templates"), "--out", str(out)]
    built = subprocess.run(command, cwd=FOLDER.parent.parent, capture_output=True, text=True)
    if built.returncode:
        lines = (built.stderr or built.stdout).strip().splitlines() or ["no output"]
        return None, f"the read kernel did not build: {lines[-1][:120]}"
    sys.path.insert(0, str(FOLDER))  # its reference, for torch.ops.etvk.stream_read
    runtime.load_ops(out)
    return runtime.get_op(OP), ""


def read_buffers(nbytes: int, copies: int) -> list[Tensor]:
    """`copies` device buffers of `nbytes` bytes rounded up to whole 16-byte units."""
    units = -(-nbytes // 16)
    return [Tensor.from_torch(torch.randint(-128, 128, (16 * units,), dtype=torch.int8))
            for _ in range(copies)]
