"""Runtime benchmark (not a test): Python overhead per dispatch and quantize throughput.

Prints, on the default device (``ETVK_DEVICE`` picks another):

1. Overhead of one small dispatch: record + submit + wait of a fresh stream,
   and replay of a recorded stream, next to the GPU time of the same dispatch
   from timestamp queries (the baseline measured in the same run).
2. Throughput of every quantize-family variant in GB/s (bytes read + written
   over the GPU time from timestamp queries).
3. With CUDA available (the NVIDIA machine): ``torch.quantize_per_tensor`` on
   CUDA on the same tensor, timed with CUDA events in the same run, and the
   ratio of our per-tensor quantize to it.

Usage: ``python benchmarks/runtime_bench.py [--elements N] [--repeats R] [--only REGEX]``
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runtime  # noqa: E402
from runtime.ops.library import catalog  # noqa: E402
from runtime.tools.examples import EXAMPLES  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402

QUANTIZE = "etvk.quantize_per_tensor.default"
BACK_TO_BACK = 8  # dispatches per submitted stream in the throughput runs
# Continuous work before timing each variant. GPUs drop their clocks while the
# host prepares the next inputs (an H100 idles at 360 MHz), and short timed
# bursts do not ramp them back: without this, variants timed later in the run
# looked up to 4x slower than the same dispatch timed first.
WARMUP_SECONDS = 1.0


def median_us(fn, repeats: int) -> float:
    fn()  # warm-up: pipeline creation, first allocation
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def overhead(repeats: int) -> None:
    op = runtime.get_op(QUANTIZE)
    x = torch.randn(64)
    variant = "quantize_per_tensor_buffer_float_int8"
    args = (0.05, 0, -128, 127, torch.int8)
    with Stream() as upload_stream:
        x_dev = upload_stream.upload(x, catalog().variant(variant).binding("t_in"), "bench x")

    def fresh():
        with Stream() as stream:
            op.record(stream, x_dev, *args, variant=variant)
            stream.run()

    with Stream() as recorded:
        op.record(recorded, x_dev, *args, variant=variant)
        recorded.run()
        replay_us = median_us(recorded.replay, repeats)
        # After the replays: a first run may include the driver's lazy shader compile.
        gpu = [seconds for _, seconds in recorded.timings()]
    fresh_us = median_us(fresh, repeats)
    gpu_us = gpu[0] * 1e6 if gpu else float("nan")
    print("\n== Python overhead per dispatch (64 values, quantize_per_tensor) ==")
    print(f"{'path':<34} {'us/call':>10} {'x GPU time':>11}")
    for name, us in (("record + submit + wait", fresh_us), ("replay (submit + wait)", replay_us)):
        print(f"{name:<34} {us:>10.1f} {us / gpu_us:>11.1f}")
    print(f"{'GPU time (timestamps), baseline':<34} {gpu_us:>10.1f} {1.0:>11.1f}")
    print(f"record + submit + wait / replay = {fresh_us / replay_us:.2f}")


def gpu_seconds(stream: Stream, repeats: int) -> float:
    """Median GPU time of one dispatch over `repeats` replays, after WARMUP_SECONDS of replays."""
    end = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < end:
        stream.replay()
    samples = []
    for _ in range(repeats):
        stream.replay()
        samples += [seconds for _, seconds in stream.timings()]
    return statistics.median(samples)


def throughput(elements: int, repeats: int, only: re.Pattern) -> float | None:
    """Prints GB/s per quantize-family variant; returns per-tensor int8 fp32 buffer GB/s."""
    caps = get_device().caps
    gen = torch.Generator().manual_seed(0)
    shape = (max(1, elements >> 20), 1024, 1024)
    print(f"\n== Throughput, {'x'.join(map(str, shape))} values, median of {repeats} x {BACK_TO_BACK} "
          f"back-to-back dispatches (timestamps), after {WARMUP_SECONDS:g} s of warm-up each ==")
    print(f"{'variant':<50} {'MB moved':>9} {'GPU us':>9} {'GB/s':>8}")
    baseline = None
    for name, build in EXAMPLES.items():
        op = runtime.get_op(name)
        if op.opdef.family != "quantize":  # the other families have kernel benchmarks of their own
            continue
        for info in op.variants:
            if not only.search(info.name) or not info.runnable(caps)[0]:
                continue
            args, kwargs = build(info.axes, shape, gen)
            with Stream() as stream:
                # Back-to-back dispatches keep the GPU busy between host round trips.
                for _ in range(BACK_TO_BACK):
                    outputs = op.record(stream, *args, **kwargs, variant=info.name)
                outputs = outputs if isinstance(outputs, tuple) else (outputs,)
                stream.run()
                if not stream.timings():
                    print("device has no timestamp queries; skipping throughput")
                    return None
                seconds = gpu_seconds(stream, repeats)
            moved = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
            moved += sum(o.nbytes for o in outputs)
            gbps = moved / seconds / 1e9
            if info.name == "quantize_per_tensor_buffer_float_int8":
                baseline = gbps
            print(f"{info.name:<50} {moved / 1e6:>9.2f} {seconds * 1e6:>9.1f} {gbps:>8.1f}")
    return baseline


def cuda_baseline(elements: int, repeats: int, ours_gbps: float | None) -> None:
    if not torch.cuda.is_available():
        print("\n(no CUDA device: torch.quantize_per_tensor comparison skipped)")
        return
    x = torch.randn(elements // 1024, 1024, device="cuda")
    end = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < end:
        torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeats * BACK_TO_BACK):  # as many timed dispatches as ours
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
        end.record()
        samples.append((start, end))
    torch.cuda.synchronize()
    seconds = statistics.median(start.elapsed_time(end) / 1e3 for start, end in samples)
    gbps = elements * 5 / seconds / 1e9
    print("\n== torch.quantize_per_tensor on CUDA, same shape, fp32 -> qint8 ==")
    print(f"{'torch CUDA':<50} {elements * 5 / 1e6:>9.2f} {seconds * 1e6:>9.1f} {gbps:>8.1f}")
    if ours_gbps:
        print(f"ours (quantize_per_tensor_buffer_float_int8) / torch CUDA = {ours_gbps / gbps:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=None, help="values per tensor (default: 64Mi on a GPU, 4Mi on a CPU device)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--only", default="", help="regular expression: time only matching variants")
    parser.add_argument("--skip-overhead", action="store_true", help="skip the overhead section")
    options = parser.parse_args()
    try:
        caps = get_device().caps
    except runtime.VulkanUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    elements = options.elements or (4 << 20 if caps.family in ("llvmpipe", "swiftshader") else 64 << 20)
    print(f"device: {caps.name} (family {caps.family})")
    if not options.skip_overhead:
        overhead(options.repeats * 10)
    ours = throughput(elements, options.repeats, re.compile(options.only))
    cuda_baseline(elements, options.repeats, ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
