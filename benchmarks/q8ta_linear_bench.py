"""q8ta_linear benchmark (not a test): int8 x int8 classifier heads against bf16 F.linear.

Times ``etvk.q8ta_linear.default`` (int8 output, plain [M, K] input) at
N_out = 1000, K = 512, 2048, 4096 and M = 1, 8, 32 rows: GPU time per call
and weight GB/s (the int8 weight bytes over the GPU time). Weights are
rotated over enough distinct copies (at least 80 MB in all) that every call
reads weights that are not in an H100's 50 MB L2 cache, as in a model where
the layers before the head evict them; one call per copy is recorded in one
stream. Baseline in the same run, with CUDA (else "n/a"):
``torch.nn.functional.linear`` in bf16 over as many weight copies, timed per
call with CUDA events.

Method (benchmarks/NOTES.md): every measured thing gets ~1 s of continuous
work first (an idle H100 drops its clock), then a median over timestamped
calls.

Usage: ``python benchmarks/q8ta_linear_bench.py [--quick] [--repeats R]``
(``--quick``: K = 512 and M = 1, 8, 2 weight copies, short warm-up; runs on lavapipe.)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import Results  # noqa: E402
from timing import drop_validation, open_device, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.tools.examples_q8ta_linear import Q8taLinearCase, make_inputs  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402

drop_validation()

OP = "etvk.q8ta_linear.default"
N_OUT = 1000
ROTATION_BYTES = 80e6
TIMED_SECONDS = 0.5  # replays after the warm-up: about this long, `--repeats` at most


def time_ours(inputs: list, repeats: int, warmup: float):
    """(median GPU seconds of one call, variant), or None without timestamp queries."""
    op = runtime.get_op(OP)
    with Stream() as stream:
        for inp in inputs:
            op.record(stream, *inp.args())
        stream.run()
        timings = stream.timings()
        if not timings:
            return None
        replay_seconds = warm(stream.replay, warmup)
        samples = []
        for _ in range(max(3, min(repeats, math.ceil(TIMED_SECONDS / replay_seconds)))):
            stream.replay()
            samples += [seconds for _, seconds in stream.timings()]
    return statistics.median(samples), timings[0][0]


def time_bf16(m: int, k: int, copies: int, repeats: int, warmup: float):
    """Median seconds of bf16 F.linear on CUDA over `copies` weights, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    weights = [torch.randn(N_OUT, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    return time_cuda(lambda i: torch.nn.functional.linear(x, weights[i]), copies, repeats * 8, warmup)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="K=512, M=1 and 8, 2 weight copies, short warm-up (CPU drivers)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="replays of each recorded stream after the warm-up, at most (default 20)")
    options = parser.parse_args()
    caps = open_device()
    if caps is None:
        return 1
    record = Results("q8ta_linear")
    record.device(caps)
    ks, ms = ((512,), (1, 8)) if options.quick else ((512, 2048, 4096), (1, 8, 32))
    warmup = 0.05 if options.quick else 1.0
    print(f"\n== {OP}, N_out={N_OUT}, int8 output: median GPU time per call, weights rotated ==")
    print(f"{'M':>3} {'K':>5} {'copies':>6} {'what':<34} {'GPU us':>9} {'GB/s':>8} {'ours/this':>10}")
    for k in ks:
        copies = 2 if options.quick else math.ceil(ROTATION_BYTES / (N_OUT * k))
        for m in ms:
            inputs = [make_inputs(Q8taLinearCase(f"bench_{m}_{k}", m, k, N_OUT), seed=i)
                      for i in range(copies)]
            measured = time_ours(inputs, options.repeats, warmup)
            if measured is None:
                print("device has no timestamp queries: nothing to time")
                return 1
            ours, variant = measured
            rows = [(f"ours {variant}", ours, N_OUT * k),
                    ("torch F.linear bf16", time_bf16(m, k, copies, options.repeats, warmup), 2 * N_OUT * k)]
            for what, seconds, nbytes in rows:
                record.kernel("q8ta_linear", f"M={m} K={k} N={N_OUT}", what.replace("ours ", "etvk "),
                              seconds, nbytes)
                if seconds is None:
                    print(f"{m:>3} {k:>5} {copies:>6} {what:<34} {'n/a':>9}")
                    continue
                print(f"{m:>3} {k:>5} {copies:>6} {what:<34} {seconds * 1e6:>9.2f} "
                      f"{nbytes / seconds / 1e9:>8.1f} {ours / seconds:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
