"""Program benchmark (not a test): end-to-end time of loaded int8 models next to PyTorch on CUDA.

Each argument names a saved program and the torchvision architecture it was
exported from: ``NAME:PATH`` (``python -m runtime export NAME --batch B --out
PATH``; the batch is read from the program). A NAME that is no torchvision
architecture (a program of one's own model) gets no torch columns. For each it reports, measured in
the same run on the same machine:

- ``call``: ``loaded(x)``, torch tensors in and out (upload, every device
  segment, the CPU nodes between them, download);
- ``resident``: the same with the input already on the device and the output
  left there (`LoadedProgram.run_resident`);
- ``device``: the sum of the dispatches' GPU timestamps of one call, and ``cpu``
  the time spent in CPU nodes;
- ``torch fp16``: the float model on CUDA in fp16, channels_last, eager;
  ``compile``: the same through ``torch.compile`` (default mode); and ``CUDA
  graphs``: ``torch.compile(mode="reduce-overhead")``, what a CUDA user runs for
  small batches (the default mode swings 2x between runs at batch 1); all timed
  with CUDA events after a warm-up;
- per op kind (from `LoadedProgram.profile`): the share of device time, and
  what it achieved: TOPS (two per multiply-add) for the convs and linears,
  GB/s (every tensor read and written, once) for the others, next to the copy
  bandwidth measured in the same run (runtime_bench.py's yardstick: the faster of
  vkCmdCopyBuffer and torch's CUDA copy);
- with ``--slowest N``, the N nodes that took the most device time in that
  profile: node name, op kind, variant, output shape, time and rate, which points
  at the dispatches inside an op kind (one slow pool among 17).

With ``--one-word`` each program is loaded and timed a second time within
`runtime.families.q8ta_copy.one_word_each` (the copy-like int8 ops on their
one-word kernels instead of 16-byte quads), as the row ``NAME (one word)``
without torch baselines, in the same run.

Method (benchmarks/NOTES.md): every timed thing is first run for a second of
continuous work (an idle GPU drops its clock); medians of ``--repeat`` runs.
Validation is off. Without CUDA the torch columns print "n/a".

Usage: ``python benchmarks/program_bench.py resnet50:r50_b1.etvk mobilenet_v2:mv2_b1.etvk``
``[--repeat 20] [--warmup 1.0] [--no-compile | --compile-modes default,reduce-overhead] [--one-word]``
``[--slowest N]``
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

from copy_bandwidth import copy_seconds  # noqa: E402
from timing import cuda_copy_seconds, drop_validation, median_seconds, open_device, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.families.q8ta_copy import one_word_each  # noqa: E402
from runtime.programs.nodes import Const, Ref, walk_args  # noqa: E402
from runtime.tools.models import TORCHVISION_MODELS, torchvision_model  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402

drop_validation()


# torch.compile modes -> the key of their column
COMPILE_MODES = {"default": "compiled", "reduce-overhead": "graphs"}


def _torch_baselines(name: str, shape, repeat: int, warmup: float, modes) -> dict:
    """Seconds of the fp16 model on CUDA: ``eager``, and per mode of `modes` (`COMPILE_MODES`)
    ``compiled`` (default mode) or ``graphs`` (mode "reduce-overhead"); {} without CUDA or for
    a `name` that is no torchvision architecture."""
    if not torch.cuda.is_available() or name not in TORCHVISION_MODELS:
        return {}
    model = torchvision_model(name).half().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(shape, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = True
    found = {}
    with torch.no_grad():
        found["eager"] = time_cuda(lambda i: model(x), 1, repeat, warmup)
        for mode in modes:
            fast = torch.compile(model, mode=mode)
            for _ in range(3):  # compile, and record the CUDA graph, outside the timing
                fast(x)
            found[COMPILE_MODES[mode]] = time_cuda(lambda i, fast=fast: fast(x), 1, repeat, warmup)
            torch._dynamo.reset()
    return found


# Ops whose work is counted in multiply-adds (TOPS); the others move bytes (GB/s).
_MAC_OPS = ("etvk.q8ta_conv2d.default", "etvk.q8ta_conv2d_pw_pair.default", "etvk.q8ta_linear.default")


def _work(program, node) -> tuple[int, int]:
    """(multiply-adds, bytes read and written once) of `node`: a conv's from its output, its
    input channels per group and its kernel; a pointwise pair's, its two 1x1 convs'; a
    linear's from its output and input rows."""
    def nbytes(name, table):  # a ValueSpec or a constant tensor
        return table[name].dtype.itemsize * int(torch.Size(table[name].shape).numel())
    moved = sum(nbytes(a.name, program.values) for a in walk_args(node.args) if isinstance(a, Ref))
    moved += sum(nbytes(a.name, program.constants) for a in walk_args(node.args) if isinstance(a, Const))
    moved += sum(nbytes(name, program.values) for name in node.outputs)
    out = program.values[node.outputs[0]].shape
    if node.target == "etvk.q8ta_conv2d.default":
        c_in, (kh, kw), groups = program.values[node.args[0].name].shape[1], node.args[9], node.args[13]
        return int(torch.Size(out).numel()) * c_in // groups * kh * kw, moved
    if node.target == "etvk.q8ta_conv2d_pw_pair.default":
        n, c_in = program.values[node.args[0].name].shape[:2]
        return n * program.constants[node.args[3].name].shape[0] * (c_in + out[1]), moved
    if node.target == "etvk.q8ta_linear.default":
        return int(torch.Size(out).numel()) * program.values[node.args[0].name].shape[1], moved
    return 0, moved


def _op_kind(row: dict) -> str:
    return row["op"].removeprefix("etvk.").removesuffix(".default") if row["runs_on"] == "vulkan" \
        else f"cpu: {row['target']}"


def bench(name: str, path: Path, repeat: int, warmup: float, modes, torch_baselines: bool = True) -> dict:
    """The program's timings (`torch_baselines`: also the torch model's, `name` its architecture)."""
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
    per_kind: dict[str, list] = defaultdict(lambda: [0.0, 0, 0])  # seconds, multiply-adds, bytes
    per_node = []  # (seconds, node, kind, variant, output shape, multiply-adds, bytes)
    device = statistics.median(sum(r["seconds"] or 0 for r in rows if r["runs_on"] == "vulkan")
                               for rows in profiles)
    cpu = statistics.median(sum(r["seconds"] for r in rows if r["runs_on"] == "cpu") for rows in profiles)
    nodes = {node.name: node for node in loaded.program.nodes}
    for row in profiles[-1]:
        kind = per_kind[_op_kind(row)]
        node = nodes[row["node"]]
        macs, moved = _work(loaded.program, node)
        macs = macs if node.target in _MAC_OPS else 0
        kind[0] += row["seconds"] or 0.0
        kind[1] += macs
        kind[2] += moved
        per_node.append((row["seconds"] or 0.0, row["node"], _op_kind(row), row["variant"],
                         tuple(loaded.program.values[node.outputs[0]].shape), macs, moved))
    torch_seconds = _torch_baselines(name, shape, repeat, warmup, modes) if torch_baselines else {}
    return {"name": name, "batch": shape[0], "load": load_seconds, "call": call, "resident": resident,
            "device": device, "cpu": cpu, "eager": torch_seconds.get("eager"),
            "compiled": torch_seconds.get("compiled"), "graphs": torch_seconds.get("graphs"),
            "kinds": dict(per_kind), "per_node": sorted(per_node, reverse=True),
            "nodes": len(loaded.program.nodes),
            "on_device": sum(r["runs_on"] == "vulkan" for r in loaded.placement())}


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def _rate(seconds: float, macs: int, moved: int, bandwidth: float | None) -> str:
    """TOPS for work counted in multiply-adds, else GB/s (and its share of the copy bandwidth)."""
    if not seconds:
        return "n/a"
    if macs:
        return f"{2 * macs / seconds / 1e12:.2f} TOPS"
    return f"{moved / seconds / 1e9:.0f} GB/s" + (f" ({moved / seconds / bandwidth:.0%} of copy)" if bandwidth else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("programs", nargs="+", help="NAME:PATH, NAME a torchvision architecture")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per measurement")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    parser.add_argument("--compile-modes", default=",".join(COMPILE_MODES),
                        help=f"torch.compile modes timed (default {','.join(COMPILE_MODES)})")
    parser.add_argument("--one-word", action="store_true",
                        help="also time each program with the copy-like ops one word an invocation")
    parser.add_argument("--slowest", type=int, default=0, metavar="N",
                        help="also list each program's N nodes that took the most device time")
    args = parser.parse_args()
    if args.slowest < 0:
        parser.error(f"--slowest must be >= 0, got {args.slowest}")
    if open_device() is None:
        return 1
    modes = [] if args.no_compile else args.compile_modes.split(",")
    unknown = sorted(set(modes) - set(COMPILE_MODES))
    if unknown:
        parser.error(f"--compile-modes: unknown {', '.join(unknown)}; known: {', '.join(COMPILE_MODES)}")
    # runtime_bench.py's yardstick: 1 GiB on a GPU (far past its caches), 64 MiB on a CPU driver;
    # at least a second of copies first, or an idle GPU's clock reads low
    # and the faster of vkCmdCopyBuffer and torch's CUDA copy kernel (the H200's copy engine
    # reads ~0.85 TB/s where kernels reach 4 and more)
    nbytes = 64 << 20 if get_device().caps.family in ("llvmpipe", "swiftshader") else 1 << 30
    copies = {"vkCmdCopyBuffer": copy_seconds(get_device(), nbytes, max(1.0, args.warmup), args.repeat),
              "torch CUDA copy": cuda_copy_seconds(nbytes, args.repeat, max(1.0, args.warmup))}
    rates = {how: 2 * nbytes / seconds for how, seconds in copies.items() if seconds}
    bandwidth = max(rates.values(), default=None)
    print("copy bandwidth (read + written): " + (", ".join(
        f"{how} {rate / 1e9:.0f} GB/s" for how, rate in rates.items()) or "n/a"))
    results = []
    for spec in args.programs:
        name, _, path = spec.partition(":")
        note = "" if name in TORCHVISION_MODELS else " (not a torchvision architecture: no torch columns)"
        print(f"-- {name} {path}{note}", flush=True)
        results.append(bench(name, Path(path), args.repeat, args.warmup, modes))
        if args.one_word:
            with one_word_each():
                results.append(bench(f"{name} (one word)", Path(path), args.repeat, args.warmup, modes,
                                     torch_baselines=False))
    print("\n| model | batch | nodes on device | call ms | resident ms | device ms | CPU nodes ms "
          "| torch fp16 eager ms | torch.compile ms | torch.compile + CUDA graphs ms "
          "| resident / compile | resident / CUDA graphs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ratios = [f"{r['resident'] / r[k]:.2f}" if r[k] else "n/a" for k in ("compiled", "graphs")]
        print(f"| {r['name']} | {r['batch']} | {r['on_device']}/{r['nodes']} | {_ms(r['call'])} | "
              f"{_ms(r['resident'])} | {_ms(r['device'])} | {_ms(r['cpu'])} | {_ms(r['eager'])} | "
              f"{_ms(r['compiled'])} | {_ms(r['graphs'])} | {' | '.join(ratios)} |")
    for r in results:
        total = sum(seconds for seconds, _, _ in r["kinds"].values()) or 1.0
        print(f"\n{r['name']} batch {r['batch']} (load {r['load']:.1f} s), per op kind:")
        for kind, (seconds, macs, moved) in sorted(r["kinds"].items(), key=lambda kv: -kv[1][0]):
            print(f"  {kind:<40} {seconds * 1e3:8.3f} ms ({100 * seconds / total:3.0f} %)  "
                  f"{_rate(seconds, macs, moved, bandwidth)}")
        if args.slowest:
            print(f"\n{r['name']} batch {r['batch']}, the {args.slowest} slowest nodes:")
            for seconds, node, kind, variant, shape, macs, moved in r["per_node"][:args.slowest]:
                print(f"  {node:<28} {kind:<26} {variant or '-':<40} {str(list(shape)):<20} "
                      f"{seconds * 1e6:8.1f} us  {_rate(seconds, macs, moved, bandwidth)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
