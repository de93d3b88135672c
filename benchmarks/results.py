"""Machine-readable benchmark results: one JSON object a line, for benchmarks/report.py.

When ``ETVK_BENCH_RESULTS`` names a folder, `Results(bench)` writes
``<folder>/<bench>.jsonl`` (replacing an earlier run of that benchmark) next
to the tables the benchmark prints; otherwise it writes nothing. Records:

- ``{"kind": "device", "vulkan": name, "family": f, "cuda": name or null}``
- ``{"kind": "kernel", "group": g, "case": c, "impl": i, "seconds": s,
  "bytes": b or null, "ops": o or null}``: one timed call of a kernel
  (``impl`` "etvk" for ours, else the baseline's name) on a workload
  ``case``; GB/s is bytes / s, TOPS ops / s.
- ``{"kind": "copy", "bytes": b, "seconds": s}``: the device-to-device copy
  (bytes read + written).
- ``{"kind": "overhead", "case": c, "wall_us": w, "gpu_us": g, "cpu_us": u,
  "host_us": h, "dispatches": n}``: host time of small calls (host_us per
  dispatch; cpu_us the calling thread's CPU time per call).

Used by every benchmark script; it must not time anything itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "ETVK_BENCH_RESULTS"


class Results:
    """Appends records of one benchmark to ``$ETVK_BENCH_RESULTS/<bench>.jsonl`` when that is set."""

    def __init__(self, bench: str):
        folder = os.environ.get(ENV)
        self.path = Path(folder) / f"{bench}.jsonl" if folder else None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    def emit(self, kind: str, **fields) -> None:
        """Write one record (a no-op without ``ETVK_BENCH_RESULTS``)."""
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(json.dumps({"kind": kind, **fields}) + "\n")

    def device(self, caps) -> None:
        """The device record: the Vulkan device (a `Capabilities`) and the CUDA one, if any."""
        import torch

        cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        self.emit("device", vulkan=caps.name, family=caps.family, cuda=cuda)

    def kernel(self, group: str, case: str, impl: str, seconds: float | None,
               nbytes: int | None = None, ops: int | None = None) -> None:
        """One kernel timing (nothing when `seconds` is None: a baseline that could not run)."""
        if seconds:
            self.emit("kernel", group=group, case=case, impl=impl, seconds=seconds, bytes=nbytes,
                      ops=ops)
