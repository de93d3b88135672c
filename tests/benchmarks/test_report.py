"""The benchmark report: results written by benchmarks/results.py, turned into markdown and PNGs by
benchmarks/report.py (from a small set of recorded results; no device needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from report import build, load  # noqa: E402
from results import ENV, Results  # noqa: E402

RECORDS = [
    {"kind": "device", "vulkan": "NVIDIA H100 80GB HBM3", "family": "nvidia", "cuda": "NVIDIA H100 80GB HBM3"},
    {"kind": "copy", "bytes": 2 << 30, "seconds": 0.8e-3},
    {"kind": "overhead", "case": "fresh op call (upload, record, submit, wait, download)", "wall_us": 70.0,
     "gpu_us": 4.0, "cpu_us": 50.0, "host_us": 66.0, "dispatches": 1},
    {"kind": "kernel", "group": "quantize", "case": "quantize_per_tensor_buffer_float_int8", "impl": "etvk",
     "seconds": 111e-6, "bytes": 335544320, "ops": None},
    {"kind": "kernel", "group": "quantize", "case": "quantize_per_tensor_buffer_float_int8",
     "impl": "torch CUDA", "seconds": 118e-6, "bytes": 335544320, "ops": None},
    {"kind": "kernel", "group": "conv2d", "case": "resnet50 l1 3x3 b1", "impl": "etvk im2col",
     "seconds": 16.5e-6, "bytes": None, "ops": 231211008},
    {"kind": "kernel", "group": "conv2d", "case": "resnet50 l1 3x3 b1", "impl": "cuDNN fp16",
     "seconds": 12.2e-6, "bytes": None, "ops": 231211008},
]


def _write(folder: Path) -> Path:
    results = folder / "results"
    results.mkdir()
    (results / "runtime.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS[:5]))
    (results / "conv2d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (RECORDS[0], *RECORDS[5:])))
    return results


def test_report_writes_markdown_and_the_plots_it_references(tmp_path):
    pytest.importorskip("matplotlib")
    path = build(load(_write(tmp_path)), tmp_path / "out")
    text = path.read_text()
    for group in ("quantize", "conv2d"):
        image = tmp_path / "out" / f"{group}.png"
        assert image.stat().st_size > 1000 and image.read_bytes()[:4] == b"\x89PNG"
        assert f"]({group}.png)" in text
    assert "2684.4 GB/s" in text  # the copy: 2 GiB over 0.8 ms
    assert "| 66.00 | <= 60 µs |" in text  # host time and its H100 target
    assert "0.94 (torch CUDA)" in text and "1.35 (cuDNN fp16)" in text  # ours / baseline times
    assert "plots skipped" not in text


def test_report_without_matplotlib_still_writes_the_tables(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    text = build(load(_write(tmp_path)), tmp_path / "out").read_text()
    assert "plots skipped" in text and ".png" not in text
    assert "quantize_per_tensor_buffer_float_int8 | etvk | 111.0 | 3.02e+03 | 1.13 |" in text
    assert not list((tmp_path / "out").glob("*.png"))


def test_results_are_written_only_where_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    Results("quiet").kernel("quantize", "case", "etvk", 1e-6, 10)
    assert not list(tmp_path.iterdir())
    monkeypatch.setenv(ENV, str(tmp_path / "results"))
    results = Results("loud")
    results.kernel("quantize", "case", "etvk", 1e-6, 10)
    results.kernel("quantize", "case", "torch CUDA", None, 10)  # a baseline that did not run
    records = load(tmp_path / "results")
    assert records == [{"kind": "kernel", "group": "quantize", "case": "case", "impl": "etvk",
                        "seconds": 1e-6, "bytes": 10, "ops": None, "bench": "loud"}]
    Results("loud")  # a new run of the same benchmark replaces the old records
    assert load(tmp_path / "results") == []
