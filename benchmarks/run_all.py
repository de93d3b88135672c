"""Runs every kernel benchmark, then writes the report (``make bench``, ``scripts/gpu_session.sh bench``).

Each benchmark runs in its own process with validation off and
``ETVK_BENCH_RESULTS`` pointing at ``OUT/results``; its output goes to the
terminal (with a progress line before each) and to ``OUT/logs/<name>.log``.
Then benchmarks/report.py turns the results into ``OUT/REPORT.md`` and PNG
plots. On a CPU driver (lavapipe, SwiftShader) every benchmark runs with
``--quick`` (tiny sizes, about half a minute in all) unless ``--full``.
A failing benchmark is reported and the others still run; the exit status
is then 1.

Usage: ``python benchmarks/run_all.py [--out DIR] [--quick | --full]`` (default
DIR: ``$OUT/bench-report`` when ``OUT`` is set, else ``benchmarks/report``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from report import build, load  # noqa: E402
from results import ENV  # noqa: E402

import runtime  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402

BENCHMARKS = ("runtime_bench.py", "q8ta_binary_bench.py", "q8ta_gather_pool_bench.py", "linear_bench.py",
              "q8ta_linear_bench.py", "conv2d_bench.py")
CPU_FAMILIES = ("llvmpipe", "swiftshader")


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "bench-report" if os.environ.get("OUT") else HERE / "report"


def run(script: str, quick: bool, results: Path, log: Path) -> int:
    """Run one benchmark, its output to the terminal and to `log`; returns its exit status."""
    env = dict(os.environ, ETVK_VALIDATION="0", PYTHONUNBUFFERED="1", **{ENV: str(results)})
    command = [sys.executable, str(HERE / script), *(["--quick"] if quick else [])]
    with log.open("w") as f, subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True) as child:
        for line in child.stdout:
            sys.stdout.write(line)
            f.write(line)
    return child.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    sizes = parser.add_mutually_exclusive_group()
    sizes.add_argument("--quick", action="store_true", help="tiny sizes on any device")
    sizes.add_argument("--full", action="store_true", help="full sizes, also on a CPU driver")
    options = parser.parse_args()
    try:
        device = get_device()
    except runtime.VulkanUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    quick = options.quick or (device.caps.family in CPU_FAMILIES and not options.full)
    device.close()  # the benchmarks open their own
    out = options.out or default_out()
    results, logs = out / "results", out / "logs"
    results.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    for stale in results.glob("*.jsonl"):
        stale.unlink()
    failed, started = [], time.perf_counter()
    for i, script in enumerate(BENCHMARKS, 1):
        print(f"\n##### [{i}/{len(BENCHMARKS)}] {script}{' --quick' if quick else ''} "
              f"({time.perf_counter() - started:.0f} s elapsed)", flush=True)
        if run(script, quick, results, logs / f"{Path(script).stem}.log") != 0:
            failed.append(script)
            print(f"##### {script} failed (log: {logs / Path(script).stem}.log)", flush=True)
    records = load(results)
    if records:
        print(f"\nreport: {build(records, out)} ({time.perf_counter() - started:.0f} s in all)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed or not records else 0


if __name__ == "__main__":
    sys.exit(main())
