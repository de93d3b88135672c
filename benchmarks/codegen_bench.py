"""Benchmark `python -m codegen generate`: cold (an empty output folder) and no-op.

Cold: an empty output folder, so every variant is rendered, written,
compiled with glslc into its spv/ and validated with spirv-val. No-op: the same command again with everything up to date (targets:
cold < 10 s for ~52 variants on 2 cores, no-op < 0.3 s). Each figure is the
wall time of a whole `python -m codegen generate` process, interpreter start
included; the baseline measured in the same run is a bare `python -c pass`.
Usage: python benchmarks/codegen_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_generate(out: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "codegen", "generate", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"generate failed:\n{proc.stderr}")
    return elapsed


def interpreter_start() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="no-op runs (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="etvk-codegen-bench-") as tmp:
        out = Path(tmp) / "generated"
        cold = run_generate(out)
        noop = [run_generate(out) for _ in range(args.repeat)]
        bare = statistics.median(interpreter_start() for _ in range(args.repeat))
        manifest = json.loads((out / "manifest.json").read_text())
        n_variants = len(manifest["variants"])
        n_spv = len(list((out / "spv").glob("*.spv")))
    print(f"variants: {n_variants} ({n_spv} distinct SPIR-V binaries), cpus: {os.cpu_count()}")
    print(f"baseline, interpreter start (python -c pass): {bare:.3f} s")
    print(f"cold generate + compile: {cold:.2f} s = {cold / bare:.1f}x baseline (target < 10 s)")
    print(f"no-op generate: median {statistics.median(noop):.3f} s = "
          f"{statistics.median(noop) / bare:.1f}x baseline, min {min(noop):.3f} s "
          f"over {len(noop)} runs (target < 0.3 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
