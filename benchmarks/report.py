"""Benchmark report: results (JSON lines of benchmarks/results.py) -> REPORT.md and PNG plots.

For each kernel group it plots where every kernel stands: memory-bound
groups (quantize, q8ta_quantize, q8ta_binary, q8ta_gather_pool, linear, q8ta_linear) as achieved GB/s over
the device's copy bandwidth measured in the same run (1.0 = as fast as
vkCmdCopyBuffer), compute-bound ones (conv2d) in TOPS; baselines of the same
run (torch on CUDA, cuDNN, tinygemm) sit next to ours. Tables under each
plot give the figures and ours/baseline time ratios. Without matplotlib the
markdown is written without plots (and says so).

Usage: ``python benchmarks/report.py RESULTS_DIR [--out DIR]`` (default DIR:
the parent of RESULTS_DIR). benchmarks/run_all.py calls it after the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Order and title of the groups; "GB/s" groups are plotted against the copy bandwidth.
GROUPS = {
    "quantize": ("Quantize family (per tensor / per token, buffer and texture)", "GB/s"),
    "q8ta_quantize": ("q8ta_quantize / q8ta_dequantize: fp <-> packed int8 (each layout)", "GB/s"),
    "q8ta_binary": ("q8ta_binary: int8 add, mul, concat (packed layouts)", "GB/s"),
    "q8ta_gather_pool": ("q8ta gathers and pools: shuffles, splits, pools, window sums (packed layouts)", "GB/s"),
    "linear": ("linear_qta8a_qga4w: int4 weights (weight bytes per second)", "GB/s"),
    "q8ta_linear": ("q8ta_linear: int8 weights (weight bytes per second)", "GB/s"),
    "conv2d": ("int8 conv2d (2 x MACs per second)", "TOPS"),
}
# Spec-sheet DRAM bandwidth (GB/s) of devices we run on, matched by name; a second yardstick.
PEAK_GBPS = {"H100 80GB HBM3": 3350, "H200": 4800}
# Host-overhead targets (us per dispatch, host time beyond GPU time), set on an H100.
TARGETS_US = {"fresh op call": 60, "100 small dispatches": 5}


def load(folder: Path) -> list[dict]:
    """Every record of every ``*.jsonl`` file in `folder`, files in name order."""
    records = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                records.append({**json.loads(line), "bench": path.stem})
    return records


def value(record: dict, metric: str) -> float:
    """GB/s or TOPS of a kernel record."""
    amount = record["bytes"] if metric == "GB/s" else record["ops"]
    return amount / record["seconds"] / (1e9 if metric == "GB/s" else 1e12)


def plot(path: Path, title: str, rows: list[dict], metric: str, copy_gbps: float | None,
         peak_gbps: float | None) -> bool:
    """Horizontal bars, one per (case, impl); False when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    cases = list(dict.fromkeys(r["case"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    relative = metric == "GB/s" and copy_gbps
    height = 0.8 / len(impls)
    figure, axes = pyplot.subplots(figsize=(10, 1.2 + 0.32 * len(cases) * max(1, len(impls) * 0.6)))
    colors = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, impl in enumerate(impls):
        ys, xs = [], []
        for i, case in enumerate(cases):
            for r in rows:
                if r["case"] == case and r["impl"] == impl:
                    x = value(r, metric)
                    ys.append(i + j * height)
                    xs.append(x / copy_gbps if relative else x)
        bars = axes.barh(ys, xs, height=height, label=impl, color=colors[j % len(colors)])
        axes.bar_label(bars, fmt="%.3g", fontsize=6, padding=2)
    axes.set_yticks([i + height * (len(impls) - 1) / 2 for i in range(len(cases))], cases, fontsize=7)
    axes.invert_yaxis()
    if relative:
        axes.axvline(1.0, color="black", linestyle="--", linewidth=1,
                     label=f"copy bandwidth ({copy_gbps:.0f} GB/s)")
        if peak_gbps:
            axes.axvline(peak_gbps / copy_gbps, color="gray", linestyle=":", linewidth=1,
                         label=f"spec-sheet peak ({peak_gbps:.0f} GB/s)")
        axes.set_xlabel("achieved GB/s / copy GB/s (bytes read + written)")
    else:
        axes.set_xlabel(metric)
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot.close(figure)
    return True


def group_table(rows: list[dict], metric: str, copy_gbps: float | None) -> list[str]:
    """Markdown table of one group: time, rate, share of copy bandwidth, ours/baseline time."""
    relative = metric == "GB/s" and copy_gbps
    lines = [f"| case | impl | GPU µs | {metric} |" + (" / copy |" if relative else "")
             + " ours / baseline time |",
             "|---|---|---|---|" + ("---|" if relative else "") + "---|"]
    for r in rows:
        x = value(r, metric)
        ratio = ""
        if r["impl"].startswith("etvk"):
            baselines = [b for b in rows if b["case"] == r["case"] and not b["impl"].startswith("etvk")]
            ratio = ", ".join(f"{r['seconds'] / b['seconds']:.2f} ({b['impl']})" for b in baselines)
        lines.append(f"| {r['case']} | {r['impl']} | {r['seconds'] * 1e6:.1f} | {x:.3g} |"
                     + (f" {x / copy_gbps:.2f} |" if relative else "") + f" {ratio} |")
    return lines


def overhead_table(records: list[dict]) -> list[str]:
    lines = ["| path | wall µs | GPU µs | thread CPU µs | host µs per dispatch | H100 target |",
             "|---|---|---|---|---|---|"]
    for r in records:
        target = next((f"<= {t} µs" for key, t in TARGETS_US.items() if r["case"].startswith(key)), "")
        lines.append(f"| {r['case']} | {r['wall_us']:.1f} | {r['gpu_us']:.1f} | {r['cpu_us']:.1f} "
                     f"| {r['host_us']:.2f} "
                     f"| {target} |")
    return lines


def build(records: list[dict], out: Path) -> Path:
    """Write ``out/REPORT.md`` and one PNG per kernel group; returns the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    devices = {(r["vulkan"], r["family"], r["cuda"]) for r in records if r["kind"] == "device"}
    # the fastest copy measured (vkCmdCopyBuffer may run on a DMA engine slower than a kernel)
    copies = sorted((r for r in records if r["kind"] == "copy"), key=lambda r: r["bytes"] / r["seconds"])
    copy_gbps = copies[-1]["bytes"] / copies[-1]["seconds"] / 1e9 if copies else None
    names = " ".join(f"{v} {c or ''}" for v, _, c in devices)
    peak = next((gbps for name, gbps in PEAK_GBPS.items() if name in names), None)
    lines = ["# Benchmark report", ""]
    for vulkan, family, cuda in sorted(devices, key=str):
        lines.append(f"- Vulkan device: {vulkan} (family {family}); CUDA device: {cuda or 'none'}")
    if copy_gbps:
        for copy in copies:
            lines.append(f"- Copy bandwidth ({copy.get('how', 'vkCmdCopyBuffer')}, bytes read + written, "
                         f"this run): {copy['bytes'] / copy['seconds'] / 1e9:.1f} GB/s "
                         f"({copy['bytes'] / 2**21:.0f} MiB copied)")
        lines.append(f"- The yardstick (\"/ copy\"): the fastest of these, {copy_gbps:.1f} GB/s")
    if peak:
        lines.append(f"- Spec-sheet DRAM bandwidth: {peak} GB/s")
    lines += ["", "Kernel times are medians of GPU timestamps; baselines ran in the same process. "
              "A ratio below 1 means ours is faster.", ""]
    overhead = [r for r in records if r["kind"] == "overhead"]
    if overhead:
        lines += ["## Host overhead of small dispatches", "",
                  "Host time = wall time less the GPU time of the same stream (timestamps).", "",
                  *overhead_table(overhead), ""]
    plots_missing = False
    kernels = [r for r in records if r["kind"] == "kernel"]
    for group, (title, metric) in GROUPS.items():
        rows = [r for r in kernels if r["group"] == group and r["bytes" if metric == "GB/s" else "ops"]]
        if not rows:
            continue
        lines += [f"## {title}", ""]
        image = out / f"{group}.png"
        if plot(image, title, rows, metric, copy_gbps, peak):
            lines += [f"![{group}]({image.name})", ""]
        else:
            plots_missing = True
        lines += [*group_table(rows, metric, copy_gbps), ""]
    if plots_missing:
        lines += ["(plots skipped: matplotlib is not installed; regenerate with "
                  "`python benchmarks/report.py RESULTS_DIR` where it is)", ""]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="folder of *.jsonl results")
    parser.add_argument("--out", type=Path, default=None, help="where REPORT.md and the PNGs go")
    options = parser.parse_args()
    records = load(options.results)
    if not records:
        print(f"no results in {options.results}", file=sys.stderr)
        return 1
    path = build(records, options.out or options.results.resolve().parent)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
