"""Linear benchmark (not a test): etvk.linear_qta8a_qga4w against tinygemm and bf16 on cold weights.

Times ``etvk.linear_qta8a_qga4w.default`` (int8 per-token activations x 4-bit
weights in groups of 128) at M = 1, 8, 16, 32 and 128 tokens (``--tokens``),
K = 4096, N = 4096 and 14336 (``--n``): the op's default variant (gemv for
one token, the tiled gemm or one of the two cooperative-matrix kernels for more),
and for more than one token the others of those three where the device runs
them. GPU time per call and weight GB/s (the bytes of the packed int4 weight
with its scales and zeros, over the GPU time). Next to each one-token row, the
streaming floor: a dispatch that only reads as many bytes, rotated the same way
(benchmarks/streaming_floor.py; "n/a" where its kernel cannot be built).

``--sweep`` also times every work split (C invocations per tile, GL group
lanes: the shader's push constants, all bit-identical) of the kernel each
row runs, and for more than one token the cooperative-matrix kernel at every
STEPS (its spec constant), to choose the op's rules by measurement.

Weights are ROTATED beyond the L2 cache (50 MB on an H100): several distinct
weight sets (8 for N = 4096, ~9.4 MB each; 4 for N = 14336, ~33 MB each) are
cycled through the calls recorded back to back in one stream, so every call
reads weights that are not in L2.

Baselines in the same run, with CUDA (else "n/a"), rotated over as many
weight copies and timed per call with CUDA events:

- ``torch._weight_int4pack_mm`` (tinygemm) with bf16 activations, weights
  from ``torch.ops.aten._convert_weight_to_int4pack`` and bf16 scales and
  zeros of shape [K / 128, N, 2];
- ``torch.nn.functional.linear`` in bf16.

Method (benchmarks/NOTES.md): every measured thing gets ~1 s of continuous
work first (an idle H100 drops its clock), then a median over timestamped
calls.

Usage: ``python benchmarks/linear_bench.py [--quick] [--repeats R] [--sweep] [--tokens 1,8]
[--n 512,4096] [--copies C] [--storage texture3d]`` (``--copies 1``: the weights stay in the
L2, which separates the DRAM stream from the rest of a kernel's time; ``--storage``: the
activations' and output's storage, buffer by default)
(``--quick``: K = 512, N = 256 and 512, 2 weight copies, short warm-up; runs on lavapipe.)
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import Results  # noqa: E402
from streaming_floor import INVOCATIONS, read_buffers, read_op  # noqa: E402
from timing import drop_validation, open_device, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.families.linear_weights import (  # noqa: E402
    pack_linear_meta_coop,
    pack_linear_weights,
    pack_linear_weights_coop,
    packed_row_texels,
)
from runtime.ops.library import catalog  # noqa: E402
from runtime.tools.examples import linear_args  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

drop_validation()

OP = "etvk.linear_qta8a_qga4w.default"
LEAVES = ("etvk.linear_qta8a_qga4w_tiled.default", "etvk.linear_qta8a_qga4w_coop.default",
          "etvk.linear_qta8a_qga4w_coop_few.default")
GROUP_SIZE = 128
CALLS = 16  # calls recorded back to back per stream, cycling through the weight copies
ROTATED_BYTES = 67e6  # weights per rotation for an N of one's own (--n): beyond a 50-60 MB L2
COOP_STEPS = (2, 4, 8)  # the cooperative-matrix kernel's STEPS a sweep times (8: 30 KB of shared memory)
TIMED_SECONDS = 0.5  # replays after the warm-up: about this long, `--repeats` at most
TARGET = "target: M=1 4096->14336 under 13 us (tinygemm 18.3 us on an H100)"


def activations(m: int, k: int, gen: torch.Generator) -> tuple:
    """x int8 [m, k], input_scale fp32 [m, 1], input_zero_point int32 [m, 1]."""
    x = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(m, 1, generator=gen) * 0.05 + 1e-3
    zero_point = torch.randint(-128, 128, (m, 1), generator=gen, dtype=torch.int32)
    return x, scale, zero_point


def kernel_bindings(m: int, k: int, n: int, gen: torch.Generator, storage: str) -> dict:
    """The bindings a direct dispatch shares across its calls: the output and fresh activations
    (their scales and zero points), output and activations in `storage`."""
    x, scale, zero_point = activations(m, k, gen)
    return {"t_out": Tensor.empty((m, n), torch.float32, storage), "t_x": Tensor.from_torch(x, storage),
            "t_input_scale": Tensor.from_torch(scale.reshape(-1)),
            "t_input_zero_point": Tensor.from_torch(zero_point.reshape(-1))}


def time_ours(op, m: int, k: int, weights: list, gen, repeats: int, warmup: float, storage: str):
    """Median GPU seconds of one op call (activations and output in `storage`) and the variant
    that ran; None without timestamps."""
    x, scale, zero_point = activations(m, k, gen)
    with Stream() as stream:
        for i in range(CALLS):
            weight, weight_scales, weight_zeros = weights[i % len(weights)]
            op.record(stream, x, scale, zero_point, weight, GROUP_SIZE, weight_scales, weight_zeros,
                      storage=storage)
        return time_stream(stream, repeats, warmup)


def time_split(kernel: str, m: int, k: int, n: int, packed: list, gen, split, repeats, warmup,
               storage: str):
    """Median GPU seconds of one dispatch of the KERNEL `kernel` (sdot, weights in a buffer,
    activations and output in `storage`) with the work split `split` = (C, GL), recorded
    directly with the op's bindings and push constants."""
    variant = catalog().variant(f"linear_qta8a_qga4w_{kernel}_sdot_{storage}_buffer")
    c, gl = split
    blocks = -(-n // 4)
    groups = [-(-blocks // (64 // c)), 1 if kernel != "gemm" else -(-m // 4), 1]
    with Stream() as stream:
        bindings = kernel_bindings(m, k, n, gen, storage)
        for i in range(CALLS):
            stream.dispatch(variant, OP, bindings={**bindings, "t_w": packed[i % len(packed)]},
                            push={"sizes": [k, n, m, GROUP_SIZE], "coop": [c, gl, 0, 0]}, groups=groups)
        return time_stream(stream, repeats, warmup)


def time_coop(m: int, k: int, n: int, weights: list, gen, steps: int, repeats, warmup,
              storage: str):
    """Median GPU seconds of one dispatch of the cooperative-matrix kernel (activations and
    output in `storage`) staging `steps` K steps of 32 at a time (its spec constant STEPS)."""
    variant = catalog().variant(f"linear_qta8a_qga4w_coop_{storage}")
    packed = [(Tensor.from_torch(pack_linear_weights_coop(w)),
               Tensor.from_torch(pack_linear_meta_coop(w, ws, wz, GROUP_SIZE))) for w, ws, wz in weights]
    with Stream() as stream:
        bindings = kernel_bindings(m, k, n, gen, storage)
        for i in range(CALLS):
            w, meta = packed[i % len(packed)]
            stream.dispatch(variant, OP, bindings={**bindings, "t_w": w, "t_meta": meta},
                            push={"sizes": [k, n, m, GROUP_SIZE]}, spec_constants={"STEPS": steps},
                            groups=[-(-n // 64), -(-m // 32), 1])
        return time_stream(stream, repeats, warmup)


def time_floor(nbytes: int, copies: int, repeats: int, warmup: float):
    """(median GPU seconds of a dispatch that only reads `nbytes` bytes, rotated over `copies`
    buffers as the weights are, "") or (None, why the read kernel is not there)."""
    op, why = read_op()
    if op is None:
        return None, why
    buffers = read_buffers(nbytes, copies)
    with Stream() as stream:
        for i in range(CALLS):
            op.record(stream, buffers[i % copies], INVOCATIONS)
        return time_stream(stream, repeats, warmup)[0], ""


def time_stream(stream, repeats: int, warmup: float):
    """Runs `stream`, warms it up, and returns (median GPU seconds of its dispatches, the first
    dispatch's variant), or None without timestamps."""
    stream.run()
    timings = stream.timings()
    if not timings:
        return None
    name = timings[0][0]
    replay_seconds = warm(stream.replay, warmup)
    replays = max(3, min(repeats, math.ceil(TIMED_SECONDS / replay_seconds)))
    samples = []
    for _ in range(replays):
        stream.replay()
        samples += [seconds for _, seconds in stream.timings()]
    return statistics.median(samples), name


def sweep_splits(kernel: str, k: int) -> list[tuple[int, int]]:
    """The (C, GL) pairs a sweep times: gemv C 16 to 64 and GL 8 to 32, gemm C 4 to 64 and
    GL 4 to 16 (GL at most C and the group count)."""
    groups = k // GROUP_SIZE
    cs, gls = ((16, 32, 64), (8, 16, 32)) if kernel == "gemv" else ((4, 8, 16, 32, 64), (4, 8, 16))
    return [(c, gl) for c in cs for gl in gls if gl <= min(c, groups)]


def tinygemm_setup(m: int, k: int, n: int, copies: int):
    """(fn(i), weight bytes) for torch._weight_int4pack_mm over `copies` weights, or (None, why)."""
    if not torch.cuda.is_available():
        return None, "no CUDA"
    try:
        dev = torch.device("cuda")
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        groups = k // GROUP_SIZE
        packed, qparams = [], []
        for _ in range(copies):
            q = torch.randint(0, 16, (n, k), device=dev, dtype=torch.int32)
            w_uint8 = ((q[:, ::2] << 4) | q[:, 1::2]).to(torch.uint8)  # [N, K/2], since torch 2.5
            packed.append(torch.ops.aten._convert_weight_to_int4pack(w_uint8, 8))  # innerKTiles 8
            scales = torch.rand(groups, n, device=dev) * 0.01 + 1e-3
            zeros = (torch.rand(groups, n, device=dev) - 0.5) * 0.1
            qparams.append(torch.stack([scales, zeros], dim=2).to(torch.bfloat16).contiguous())

        def fn(i):
            return torch._weight_int4pack_mm(x, packed[i], GROUP_SIZE, qparams[i])

        fn(0)
        torch.cuda.synchronize()
    except (RuntimeError, AttributeError, TypeError) as error:
        return None, f"{type(error).__name__}: {str(error).splitlines()[0][:150]}"
    return fn, n * k // 2 + groups * n * 2 * 2


def bf16_setup(m: int, k: int, n: int, copies: int):
    """(fn(i), weight bytes) for bf16 F.linear over `copies` weights, or (None, why)."""
    if not torch.cuda.is_available():
        return None, "no CUDA"
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]

    def fn(i):
        return torch.nn.functional.linear(x, weights[i])

    return fn, n * k * 2


def weight_bytes(k: int, n: int) -> int:
    """Bytes of the packed weights (int4 with scales and zeros) of a K x N linear."""
    return -(-n // 4) * 16 * packed_row_texels(k, GROUP_SIZE)


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def row(m, n, what, seconds, nbytes, ours, note="", record: Results | None = None, k=None):
    if record is not None:
        impl = what.replace("ours ", "etvk ").replace("torch._weight_int4pack_mm bf16 (tinygemm)",
                                                      "tinygemm bf16")
        record.kernel("linear", f"M={m} K={k} N={n}", impl, seconds, nbytes)
    if seconds is None:
        print(f"{m:>3} {n:>6} {what:<54} {'n/a':>9} {'':>9} {'':>9} {'':>10}  {note}", flush=True)
        return
    ratio = f"{ours / seconds:>10.2f}" if ours else f"{'':>10}"
    print(f"{m:>3} {n:>6} {what:<54} {seconds * 1e6:>9.2f} {nbytes / 1e6:>9.2f} "
          f"{nbytes / seconds / 1e9:>9.1f} {ratio}  {note}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="K=512, N=256 and 512, 2 weight copies, short warm-up (CPU drivers)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="replays of each recorded stream after the warm-up, at most (default 20)")
    parser.add_argument("--sweep", action="store_true",
                        help="also time every (C, GL) work split of each row's kernel")
    parser.add_argument("--tokens", type=_ints, default=[1, 8, 16, 32, 128],
                        help="comma-separated token counts M (default 1,8,16,32,128)")
    parser.add_argument("--n", type=_ints, default=None,
                        help="comma-separated output sizes N (default 4096,14336; quick 256,512)")
    parser.add_argument("--copies", type=int, default=None,
                        help="weight copies rotated per N (default: at least 67 MB per rotation, "
                             "beyond the L2; 1 keeps the weights in the L2 after the first call)")
    parser.add_argument("--storage", choices=("buffer", "texture3d"), default="buffer",
                        help="storage of the activations and the output (default buffer)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of continuous work before timing each row (default 1; quick 0.05)")
    options = parser.parse_args()
    started = time.perf_counter()
    caps = open_device()
    if caps is None:
        return 1
    if options.quick:
        k, sizes = 512, {256: 2, 512: 2}
        repeats = 3 if options.repeats == 20 else options.repeats
    else:
        k, sizes = 4096, {4096: 8, 14336: 4}  # N: weight copies, >= 67 MB per rotation
        repeats = options.repeats
    if options.n:
        sizes = {n: sizes.get(n, max(2, math.ceil(ROTATED_BYTES / weight_bytes(k, n))))
                 for n in options.n}
    if options.copies:
        sizes = dict.fromkeys(sizes, options.copies)
    warmup = options.warmup if options.warmup is not None else (0.05 if options.quick else 1.0)
    op = runtime.get_op(OP)
    coop_runs = catalog().variant("linear_qta8a_qga4w_coop_buffer").runnable(caps)[0]
    gen = torch.Generator().manual_seed(0)
    record = Results("linear")
    record.device(caps)
    emit = functools.partial(row, record=record, k=k)
    print(f"\n== {OP}, K={k}, group size {GROUP_SIZE}: median GPU time per call, weights rotated "
          f"over distinct copies ({CALLS} calls per stream, <= {repeats} replays after {warmup:g} s "
          f"warm-up each) ==")
    print("GB/s: weight bytes (int4 + scales/zeros; bf16 for F.linear) per GPU second. "
          "ours/this: GPU time ratio of our default variant to the row (< 1: ours faster)")
    print(f"{'M':>3} {'N':>6} {'what':<54} {'GPU us':>9} {'weight MB':>9} {'GB/s':>9} "
          f"{'ours/this':>10}")
    target_ours = target_tinygemm = target_floor = None
    for n, copies in sizes.items():
        start = time.perf_counter()
        weights = []
        for _ in range(copies):
            args, _ = linear_args((1,), k, n, GROUP_SIZE, gen)
            weights.append((args[3], args[5], args[6]))  # weight, weight_scales, weight_zeros
        our_bytes = weight_bytes(k, n)
        print(f"-- N={n}: {copies} weight copies of {our_bytes / 1e6:.1f} MB "
              f"(host set-up {time.perf_counter() - start:.1f} s; packed on first record)")
        packed = [Tensor.from_torch(pack_linear_weights(w, ws, wz, GROUP_SIZE)) for w, ws, wz in weights]
        for m in options.tokens:
            target_row = (m, n, k) == (1, 14336, 4096)  # the row TARGET names
            measured = time_ours(op, m, k, weights, gen, repeats, warmup, options.storage)
            if measured is None:
                print("device has no timestamp queries: nothing to time")
                return 1
            ours, variant = measured
            emit(m, n, f"ours {variant}", ours, our_bytes, ours)
            if m == 1:  # memory-bound: the floor of reading the same bytes
                floor, why = time_floor(our_bytes, copies, repeats, warmup)
                emit(m, n, "  streaming floor (a kernel that only reads them)", floor, our_bytes, ours, why)
                if target_row:
                    target_floor = floor
            for leaf in LEAVES if m > 1 else ():
                if variant in {info.name for info in runtime.get_op(leaf).variants}:
                    continue
                try:
                    seconds, other = time_ours(runtime.get_op(leaf), m, k, weights, gen, repeats, warmup,
                                               options.storage)
                except runtime.UnsupportedVariant as error:
                    emit(m, n, f"  {leaf}", None, 0, ours, str(error).split(": ")[-1][:60])
                    continue
                emit(m, n, f"  {other}", seconds, our_bytes, ours)
            if options.sweep and m > 1 and coop_runs:
                for steps in COOP_STEPS:
                    seconds, _ = time_coop(m, k, n, weights, gen, steps, repeats, min(warmup, 0.3),
                                           options.storage)
                    emit(m, n, f"  sweep coop STEPS={steps}", seconds, our_bytes, ours)
            if target_row:
                target_ours = ours
            if options.sweep and m <= 8:
                kernel = variant.split("_")[3]  # linear_qta8a_qga4w_<KERNEL>_...
                for split in sweep_splits(kernel, k):
                    seconds, _ = time_split(kernel, m, k, n, packed, gen, split, repeats,
                                            min(warmup, 0.3), options.storage)
                    emit(m, n, f"  sweep {kernel} C={split[0]} GL={split[1]}", seconds, our_bytes, ours)
            fn, info = tinygemm_setup(m, k, n, copies)
            if fn is None:
                emit(m, n, "torch._weight_int4pack_mm bf16 (tinygemm)", None, 0, ours, info)
            else:
                seconds = time_cuda(fn, copies, repeats * CALLS, warmup)
                emit(m, n, "torch._weight_int4pack_mm bf16 (tinygemm)", seconds, info, ours)
                if target_row:
                    target_tinygemm = seconds
            del fn
            fn, info = bf16_setup(m, k, n, copies)
            if fn is None:
                emit(m, n, "torch F.linear bf16", None, 0, ours, info)
            else:
                emit(m, n, "torch F.linear bf16", time_cuda(fn, copies, repeats * CALLS, warmup),
                    info, ours)
            del fn
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    print(f"\n{TARGET}")
    if options.quick:
        print("(--quick: sizes differ from the target's; no verdict)")
    elif target_ours is not None:
        verdict = "met" if target_ours * 1e6 < 13 else "not met"
        tiny = f"{target_tinygemm * 1e6:.1f} us" if target_tinygemm else "n/a"
        floor = f"{target_floor * 1e6:.1f} us" if target_floor else "n/a"
        print(f"this run: ours {target_ours * 1e6:.1f} us ({verdict}); tinygemm {tiny}; "
              f"streaming floor {floor}")
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
