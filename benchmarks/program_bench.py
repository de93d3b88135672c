"""Program benchmark (not a test): end-to-end time of loaded int8 models next to PyTorch on CUDA.

Each argument names a saved program and the torchvision architecture it was
exported from: ``NAME:PATH`` (``python -m runtime export NAME --batch B --out
PATH``; the batch is read from the program). For each it reports, measured in
the same run on the same machine:

- ``call``: ``loaded(x)``, torch tensors in and out (upload, every device
  segment, the CPU nodes between them, download);
- ``resident``: the same with the input already on the device and the output
  left there (`LoadedProgram.run_resident`);
- ``device``: the sum of the dispatches' GPU timestamps of one call, and ``cpu``
  the time spent in CPU nodes;
- ``torch fp16``: the float model on CUDA in fp16, channels_last, eager, and
  ``compile``: the same through ``torch.compile`` (default mode), both timed
  with CUDA events after a warm-up;
- the share of device time per op kind (from `LoadedProgram.profile`).

Method (benchmarks/NOTES.md): every timed thing is first run for a second of
continuous work (an idle GPU drops its clock); medians of ``--repeat`` runs.
Validation is off. Without CUDA the torch columns print "n/a".

Usage: ``python benchmarks/program_bench.py resnet50:r50_b1.etvk mobilenet_v2:mv2_b1.etvk``
``[--repeat 20] [--warmup 1.0] [--no-compile]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import drop_validation, median_seconds, open_device, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.tools.models import torchvision_model  # noqa: E402

drop_validation()


def _torch_baselines(name: str, shape, repeat: int, warmup: float, compile_too: bool):
    if not torch.cuda.is_available():
        return None, None
    model = torchvision_model(name).half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(shape, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    with torch.no_grad():
        eager = time_cuda(lambda i: model(x), 1, repeat, warmup)
        compiled = None
        if compile_too:
            fast = torch.compile(model)
            fast(x)  # compile outside the timing
            compiled = time_cuda(lambda i: fast(x), 1, repeat, warmup)
    return eager, compiled


def _op_kind(row: dict) -> str:
    return row["op"].removeprefix("etvk.").removesuffix(".default") if row["runs_on"] == "vulkan" \
        else f"cpu: {row['target']}"


def bench(name: str, path: Path, repeat: int, warmup: float, compile_too: bool) -> dict:
    started = time.perf_counter()
    loaded = runtime.load(path)
    load_seconds = time.perf_counter() - started
    shape = loaded.program.values[loaded.program.inputs[0]].shape
    x = torch.randn(shape)
    loaded(x)
    call = median_seconds(lambda: loaded(x), repeat, warmup)
    resident = median_seconds(loaded.run_resident, repeat, warmup)
    warm(loaded.run_resident, warmup)
    profiles = [loaded.profile(x) for _ in range(5)]
    per_kind: dict[str, float] = defaultdict(float)
    device = statistics.median(sum(r["seconds"] or 0 for r in rows if r["runs_on"] == "vulkan")
                               for rows in profiles)
    cpu = statistics.median(sum(r["seconds"] for r in rows if r["runs_on"] == "cpu") for rows in profiles)
    for row in profiles[-1]:
        per_kind[_op_kind(row)] += row["seconds"] or 0.0
    eager, compiled = _torch_baselines(name, shape, repeat, warmup, compile_too)
    return {"name": name, "batch": shape[0], "load": load_seconds, "call": call, "resident": resident,
            "device": device, "cpu": cpu, "eager": eager, "compiled": compiled, "kinds": dict(per_kind),
            "nodes": len(loaded.program.nodes),
            "on_device": sum(r["runs_on"] == "vulkan" for r in loaded.placement())}


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="+", help="NAME:PATH, NAME a torchvision architecture")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per measurement")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    args = parser.parse_args()
    if open_device() is None:
        return 1
    results = []
    for spec in args.programs:
        name, _, path = spec.partition(":")
        print(f"-- {name} {path}", flush=True)
        results.append(bench(name, Path(path), args.repeat, args.warmup, not args.no_compile))
    print("\n| model | batch | nodes on device | call ms | resident ms | device ms | CPU nodes ms "
          "| torch fp16 eager ms | torch.compile ms | resident / eager | resident / compile |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        vs_eager = f"{r['resident'] / r['eager']:.2f}" if r["eager"] else "n/a"
        vs_compiled = f"{r['resident'] / r['compiled']:.2f}" if r["compiled"] else "n/a"
        print(f"| {r['name']} | {r['batch']} | {r['on_device']}/{r['nodes']} | {_ms(r['call'])} | "
              f"{_ms(r['resident'])} | {_ms(r['device'])} | {_ms(r['cpu'])} | {_ms(r['eager'])} | "
              f"{_ms(r['compiled'])} | {vs_eager} | {vs_compiled} |")
    for r in results:
        total = sum(r["kinds"].values()) or 1.0
        shares = sorted(r["kinds"].items(), key=lambda kv: -kv[1])
        print(f"\n{r['name']} batch {r['batch']} (load {r['load']:.1f} s), time per op kind: " + ", ".join(
            f"{kind} {seconds * 1e3:.3f} ms ({100 * seconds / total:.0f} %)" for kind, seconds in shares))
    return 0


if __name__ == "__main__":
    sys.exit(main())
