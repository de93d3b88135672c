"""Every benchmark runs to its end on every GPU family (ETVK_GPU_FAMILY), at tiny sizes on the test
device: a benchmark must not depend on the family's routing (one forced a variant of a route the
nvidia family does not take). The figures themselves are not checked here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.vulkan.device import GPU_FAMILIES

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(args: list[str], family: str):
    env = dict(os.environ, ETVK_GPU_FAMILY=family, ETVK_VALIDATION="0")
    return subprocess.run([sys.executable, *args], cwd=BENCHMARKS.parent, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_runtime_bench_runs_on_every_family(family):
    result = _run([str(BENCHMARKS / "runtime_bench.py"), "--elements", "4096", "--repeats", "2",
                   "--only", "quantize_per_tensor_buffer_float_int8$"], family)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"(family {family})" in result.stdout and "quantize_per_tensor_buffer_float_int8" in result.stdout


def test_coop_gemm_bench_runs_to_the_end():
    """Tiny sizes; on a device without the coop variant its column says why."""
    from runtime.ops.library import catalog
    from runtime.vulkan.device import get_device

    result = _run([str(BENCHMARKS / "coop_gemm_bench.py"), "--quick", "--only", "l2 3x3|1024|GEMM"],
                  get_device().caps.family)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("resnet50", "int8 GEMM"))]
    assert len(rows) == 3 and all("q8ta_gemm_" in row for row in rows), result.stdout
    runnable = catalog().variant("q8ta_gemm_coop").runnable(get_device().caps)[0]
    assert ("coop: not run here" in result.stdout) != runnable
