"""GPU probe (issue 40): the many-token linear kernel's epilogues, A/B in one run.

Times `linear_qta8a_qga4w_coop` with EPILOGUE shared (each group's int32 sums through
shared memory to the lanes: the old path), matrices (the same operations on the
accumulator matrices, component-wise) and elements (element by element of the lanes'
components, float(isum) by an exponent bias) at the Llama-3.2-1B prefill shapes, 8da4w:
int8 per-token activations x int4 weights in groups of 32 (the kernel the op picks
there: the few-token kernel needs groups of 64). Each shape: each variant recorded in
its stream of `CALLS` back-to-back dispatches (activations, weights and output fixed;
each STEPS given), ~1 s of warm-up, then `ROUNDS` rounds that alternate the variants,
each a batch of replays; the median GPU time per dispatch over all samples. Prints µs,
TOPS (2 M N K per second) and each new variant's time over the old one's, and checks
every output bit for bit against the old one's, and their first `REF_TOKENS` tokens x
`REF_ROWS` rows against the fp32 reference on the CPU. (`python -m runtime stats VARIANT --spec STEPS=2` gives each variant's registers and
shared memory.)

Usage (from the repository root, on the GPU machine):
``PYTHONPATH=$PWD python gpu_probe/prefill_gemm.py [--steps 2,4] [--repeats 200]
[--warmup 1.0] [--shapes 512x2048x2048,...]``. Exits 1 when any output differs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from timing import drop_validation, open_device, warm  # noqa: E402

from runtime.families.linear_weights import pack_linear_meta_coop, pack_linear_weights_coop  # noqa: E402
from runtime.ops.library import catalog  # noqa: E402
from runtime.reference import linear as ref  # noqa: E402
from runtime.tools.examples import linear_args  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

drop_validation()

COOP = "etvk.linear_qta8a_qga4w_coop.default"
OLD = "shared"
EPILOGUES = (OLD, "matrices", "elements")
GROUP_SIZE = 32
# (tokens M, K, N): q/o_proj, gate/up_proj, down_proj, lm_head of a 512-token prefill; a
# 128-token call at 4096 -> 14336.
SHAPES = ((512, 2048, 2048), (512, 2048, 8192), (512, 8192, 2048), (512, 2048, 128256),
          (128, 4096, 14336))
CALLS = 8  # dispatches per stream
ROUNDS = 4  # alternations of the two variants
# The corner checked against the CPU reference (its tokens x rows: two token tiles, the second
# partial, and 16 row tiles, the last partial); the rest is checked between the variants.
REF_TOKENS = 40
REF_ROWS = 1000


def parse_shapes(text: str) -> tuple:
    """"512x2048x2048,128x4096x14336" -> ((512, 2048, 2048), (128, 4096, 14336))."""
    return tuple(tuple(int(v) for v in item.split("x")) for item in text.split(","))


def record(stream: Stream, variant, bindings: dict, m: int, k: int, n: int, steps: int) -> None:
    """`CALLS` dispatches of `variant` over `bindings` into `stream`."""
    for _ in range(CALLS):
        stream.dispatch(variant, COOP, bindings=bindings, push={"sizes": [k, n, m, GROUP_SIZE]},
                        spec_constants={"STEPS": steps}, groups=[-(-n // 64), -(-m // 32), 1])


def samples(stream: Stream, replays: int) -> list[float]:
    """GPU seconds of every dispatch of `replays` replays of `stream`."""
    out = []
    for _ in range(replays):
        stream.replay()
        out += [seconds for _, seconds in stream.timings()]
    return out


def differing(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many fp32 values of `a` and `b` differ in their bits."""
    return int((a.view(torch.int32) != b.view(torch.int32)).sum())


def probe(m: int, k: int, n: int, steps_list, repeats: int, warmup: float, gen) -> bool:
    """Times and checks one shape at each STEPS; prints its rows; True when every output agreed."""
    start = time.perf_counter()
    args, _ = linear_args((m,), k, n, GROUP_SIZE, gen)
    x, scale, zero_point, w, _, w_scales, w_zeros = args
    bindings = {"t_x": Tensor.from_torch(x),
                "t_w": Tensor.from_torch(pack_linear_weights_coop(w)),
                "t_meta": Tensor.from_torch(pack_linear_meta_coop(w, w_scales, w_zeros, GROUP_SIZE)),
                "t_input_scale": Tensor.from_torch(scale.reshape(-1)),
                "t_input_zero_point": Tensor.from_torch(zero_point.reshape(-1))}
    tokens, rows = min(m, REF_TOKENS), min(n, REF_ROWS)
    want = ref.linear_qta8a_qga4w(x[:tokens], scale[:tokens], zero_point[:tokens], w[:rows], GROUP_SIZE,
                                  w_scales[:rows], w_zeros[:rows])
    print(f"-- M={m} K={k} N={n} group {GROUP_SIZE} (set-up and reference {time.perf_counter() - start:.1f} s)")
    ok = True
    for steps in steps_list:
        ok = time_variants(m, k, n, steps, bindings, want, repeats, warmup) and ok
    return ok


def time_variants(m: int, k: int, n: int, steps: int, bindings: dict, want, repeats: int,
                  warmup: float) -> bool:
    """Times the variants at `steps`, alternating; prints the rows; True when every output is
    bit-identical to the old variant's and to `want` (their first tokens and rows)."""
    outs = {e: Tensor.empty((m, n), torch.float32, "buffer") for e in EPILOGUES}
    variants = {e: catalog().variant(f"linear_qta8a_qga4w_coop_buffer_{e}") for e in EPILOGUES}
    got = {}
    with contextlib.ExitStack() as stack:
        streams = {e: stack.enter_context(Stream()) for e in EPILOGUES}
        for e, stream in streams.items():
            record(stream, variants[e], {**bindings, "t_out": outs[e]}, m, k, n, steps)
            stream.run()
            got[e] = outs[e].to_torch()
        if not streams[OLD].timings():
            print("device has no timestamp queries: nothing to time")
            return False
        per_replay = {e: warm(stream.replay, warmup) for e, stream in streams.items()}
        timed = {e: [] for e in EPILOGUES}
        for _ in range(ROUNDS):
            for e, stream in streams.items():
                replays = max(3, min(math.ceil(repeats / ROUNDS), math.ceil(0.25 / per_replay[e])))
                timed[e] += samples(stream, replays)
    ops = 2 * m * n * k
    seconds = {e: statistics.median(timed[e]) for e in EPILOGUES}
    for e in EPILOGUES:
        print(f"   STEPS={steps} {variants[e].name:<42} {seconds[e] * 1e6:10.1f} us "
              f"{ops / seconds[e] / 1e12:7.1f} TOPS  ({len(timed[e])} samples, min {min(timed[e]) * 1e6:.1f} us)")
    print(f"   STEPS={steps} new/old time ratios: " + ", ".join(
        f"{e} / {OLD} {seconds[e] / seconds[OLD]:.3f}" for e in EPILOGUES if e != OLD))
    tokens, rows = want.shape
    between = {e: differing(got[OLD], got[e]) for e in EPILOGUES if e != OLD}
    against = {e: differing(got[e][:tokens, :rows], want) for e in EPILOGUES}
    ok = not any(between.values()) and not any(against.values())
    print(f"   STEPS={steps} bits differing from {OLD}'s ({m * n} values): "
          + ", ".join(f"{e} {count}" for e, count in between.items())
          + f"; from the reference on {tokens} tokens x {rows} rows: "
          + ", ".join(f"{e} {count}" for e, count in against.items())
          + f" -> {'OK' if ok else 'MISMATCH'}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=lambda t: [int(v) for v in t.split(",")], default=[2],
                        help="the kernel's STEPS to time, comma-separated (2, 4, 8; default 2)")
    parser.add_argument("--repeats", type=int, default=200, help="replays per variant at most")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of replays before timing")
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES, help="MxKxN,... (default: the five)")
    options = parser.parse_args(argv)
    caps = open_device()
    if caps is None:
        return 1
    for e in EPILOGUES:
        runnable, why = catalog().variant(f"linear_qta8a_qga4w_coop_buffer_{e}").runnable(caps)
        if not runnable:
            print(f"linear_qta8a_qga4w_coop_buffer_{e}: {why}")
            return 1
    gen = torch.Generator().manual_seed(40)
    results = [probe(m, k, n, options.steps, options.repeats, options.warmup, gen)
               for m, k, n in options.shapes]
    print("all outputs bit-identical" if all(results) else "SOME OUTPUTS DIFFER")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
