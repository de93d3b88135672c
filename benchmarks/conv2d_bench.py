"""Conv2d benchmark (not a test): TOPS of each int8 conv algorithm op on real layer shapes.

For each layer shape of ResNet-50 and MobileNetV2 (batch 1 and 32) it times
every conv op that accepts the shape, with the op's default variant:

- ``etvk.q8ta_conv2d_im2col.default`` (im2col + pointwise GEMM, 2 dispatches per call),
- ``etvk.q8ta_conv2d_general.default`` (direct),
- ``etvk.q8ta_conv2d_pw.default`` (1x1, stride 1, padding 0),
- ``etvk.q8ta_conv2d_dw.default`` (groups == C_in == C_out), on 4C1W input and, as "dw/4C",
  on 4C (the layout its pointwise neighbours give it in a program),
- ``etvk.q8ta_conv2d_im2col_coop.default`` and ``etvk.q8ta_conv2d_pw_coop.default`` (the
  cooperative-matrix GEMMs; one group), where the device runs them,

next to cuDNN fp16 (``torch.nn.functional.conv2d`` on CUDA, half, channels_last,
``cudnn.benchmark``) measured in the same run with CUDA events; without CUDA
the baseline columns print "n/a".

Method (benchmarks/NOTES.md): x is uploaded once in the op's preferred layout
(4C for im2col and pw, 4C1W for general and dw), so uploads are excluded; a
stream records several back-to-back calls, is replayed for ~1 s of continuous
work (an idle H100 drops its clock), then replayed a few times more; a call's
GPU time is the sum of its dispatches' timestamps, and the row reports the
median call. TOPS = 2 * MACs / GPU seconds; depthwise rows also print the GB/s their
activations move (input read + output written), as a share of a 1 GiB torch CUDA copy timed at
the start of the run. The cuDNN side is warmed the same
way and timed per call with CUDA events, queued behind a GPU spin so that
host launch overhead does not leak into the kernel times.

Then EfficientNet-B0's 16 squeeze-and-excite gates (``effnet se pair`` rows): each gate's
``etvk.q8ta_conv2d_pw_pair`` (one dispatch) against its two ``etvk.q8ta_conv2d`` calls in
sequence (x uploaded in 4C, a table on each conv as EfficientNet's silu and sigmoid), per
distinct shape and summed over the 16 gates, with the ratio, in the same run. Both columns
are sums of dispatch timestamps: the gap between the two convs' dependent dispatches (launch
and barrier, ~2.5 us each in a recorded program) is not in them; program_bench.py shows it.

Usage: ``python benchmarks/conv2d_bench.py [--quick] [--repeats R] [--batches 1,32] [--only REGEX]``
(``--quick``: tiny spatial sizes, batch 1 and 2, short warm-up; runs on lavapipe.) The stems
(3 input channels) alone: ``--only stem``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results import Results  # noqa: E402
from timing import cuda_copy_seconds, drop_validation, open_device, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.ops.stub_support import conv2d_algorithm, coop_gemm_kernels  # noqa: E402
from runtime.tools.examples_conv2d import (  # noqa: E402
    SE_PAIRS,
    Conv2dCase,
    make_inputs,
    make_pw_pair,
    pw_pair_convs,
)
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

drop_validation()

C = Conv2dCase
# MobileNetV2's other depthwise layers (3x3, relu6 as a clamp), for issue 41's "depthwise at the
# bandwidth limit": their rows print GB/s against a torch CUDA copy timed in the same run.
DEPTHWISE_SHAPES = [
    C(f"mbv2 dw 3x3{'/2' if s == 2 else ''} {c} {hw}", 1, c, hw, hw, c, (3, 3), (s, s), (1, 1),
      groups=c, activation="relu")
    for c, hw, s in ((32, 112, 1), (96, 112, 2), (192, 28, 1), (192, 28, 2), (384, 14, 1),
                     (576, 14, 1), (576, 14, 2), (960, 7, 1))
]
# Convs the rule keeps off the cooperative-matrix GEMMs for fewer than 64 output channels or a
# K under 64 bytes (conv2d_tiling.prefers_coop_gemm): DenseNet-121's 3x3 growth convs (32
# channels), MobileNetV2's and EfficientNet-B0's narrow projections and short-K expansions. Their
# rows time both kernels, to measure where the half-empty (or short-K) coop tile still wins.
NARROW_SHAPES = [
    *(C(f"densenet 3x3 128->32 {hw}", 1, 128, hw, hw, 32, (3, 3), padding=(1, 1)) for hw in (56, 28, 14, 7)),
    C("mbv2 project 1x1 96->24 56", 1, 96, 56, 56, 24, (1, 1)),
    C("mbv2 project 1x1 192->32 28", 1, 192, 28, 28, 32, (1, 1)),
    C("effnet project 1x1 96->16 112", 1, 96, 112, 112, 16, (1, 1)),
    C("mbv2 expand 1x1 16->96 112", 1, 16, 112, 112, 96, (1, 1), activation="relu"),
    C("mbv2 expand 1x1 32->192 28", 1, 32, 28, 28, 192, (1, 1), activation="relu"),
]
# EfficientNet-B0's squeeze-and-excite convs on 1x1 maps (the GEMM's M is the batch): the
# reductions from the expanded channels and the expansions back with more than
# conv2d.POINTWISE_DIRECT_MAX_C_IN channels (fewer take the direct conv already).
SE_SHAPES = [
    *(C(f"effnet se reduce 1x1 {c}->{s}", 1, c, 1, 1, s, (1, 1), activation="relu")
      for c, s in ((96, 4), (240, 10), (480, 20), (672, 28), (1152, 48))),
    *(C(f"effnet se expand 1x1 {s}->{c}", 1, s, 1, 1, c, (1, 1)) for s, c in ((28, 672), (48, 1152))),
]
# Real layer shapes at batch 1; the batch is replaced per run.
SHAPES = [
    C("resnet50 stem 7x7/2 3->64 224", 1, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3), activation="relu"),
    C("mbv2 stem 3x3/2 3->32 224", 1, 3, 224, 224, 32, (3, 3), (2, 2), (1, 1), activation="hardtanh"),
    C("resnet50 l1 1x1 256->64 56", 1, 256, 56, 56, 64, (1, 1), activation="relu"),
    C("resnet50 l1 3x3 64->64 56", 1, 64, 56, 56, 64, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l2 3x3 128->128 28", 1, 128, 28, 28, 128, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l3 3x3 256->256 14", 1, 256, 14, 14, 256, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l4 3x3 512->512 7", 1, 512, 7, 7, 512, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l3 1x1 1024->256 14", 1, 1024, 14, 14, 256, (1, 1), activation="relu"),
    C("mbv2 expand 1x1 24->144 56", 1, 24, 56, 56, 144, (1, 1), activation="relu"),
    C("mbv2 dw 3x3 144 56", 1, 144, 56, 56, 144, (3, 3), padding=(1, 1), groups=144, activation="relu"),
    C("mbv2 dw 3x3/2 144 56->28", 1, 144, 56, 56, 144, (3, 3), (2, 2), (1, 1), groups=144,
      activation="relu"),
    *DEPTHWISE_SHAPES,
    C("mbv2 project 1x1 144->24 56", 1, 144, 56, 56, 24, (1, 1)),
    C("mbv2 1x1 320->1280 7", 1, 320, 7, 7, 1280, (1, 1), activation="relu"),
    *NARROW_SHAPES,
    *SE_SHAPES,
]

# op short name -> (op, layout x is uploaded in, accepts(params))
OPS = {
    "im2col": ("etvk.q8ta_conv2d_im2col.default", "4C", lambda p: p.im2col_eligible),
    "im2col_coop": ("etvk.q8ta_conv2d_im2col_coop.default", "4C", lambda p: p.im2col_coop_eligible),
    "direct": ("etvk.q8ta_conv2d_general.default", "4C1W", lambda p: True),
    "pw": ("etvk.q8ta_conv2d_pw.default", "4C", lambda p: p.is_pointwise),
    "pw_coop": ("etvk.q8ta_conv2d_pw_coop.default", "4C", lambda p: p.is_pointwise and p.groups == 1),
    "dw": ("etvk.q8ta_conv2d_dw.default", "4C1W", lambda p: p.is_depthwise),
    # the layout a program's depthwise convs mostly get: their pointwise neighbours' 4C
    "dw/4C": ("etvk.q8ta_conv2d_dw.default", "4C", lambda p: p.is_depthwise),
}
# the coop ops' GEMM kernel (stub_support.coop_gemm_kernels): rows only where the device runs it
COOP_KERNELS = {"im2col_coop": "im2col", "pw_coop": "pw"}
ALGORITHM_NAMES = {"im2col": "im2col", "general": "direct", "pw": "pw", "dw": "dw",
                   "im2col_coop": "im2col_coop", "pw_coop": "pw_coop"}

MAX_CALLS = 10  # back-to-back calls per recorded stream (fewer when outputs are big)
STREAM_BYTES = 256 << 20  # outputs + im2col scratch of one recorded stream, at most
TIMED_SECONDS = 0.5  # replays after the warm-up: about this long, `--repeats` at most
COPY_BYTES = 1 << 30  # the copy yardstick of the depthwise rows' GB/s


@dataclasses.dataclass
class Settings:
    repeats: int
    warmup: float
    max_calls: int
    coop: frozenset[str] = frozenset()  # the GEMM kernels the device runs on cooperative matrices
    copy_rate: float | None = None  # bytes read + written per second by a torch CUDA copy

    @classmethod
    def rows(cls, quick: bool, repeats: int) -> Settings:
        """The elementwise benchmarks' settings: `repeats` replays after 1 s of warm-up, or with
        `quick` (CPU drivers) 3 after 0.05 s, 2 calls a stream."""
        return cls(repeats=3 if quick else repeats, warmup=0.05 if quick else 1.0,
                   max_calls=2 if quick else MAX_CALLS)


def add_row_options(parser: argparse.ArgumentParser) -> None:
    """The elementwise benchmarks' options: --quick and --repeats (for `Settings.rows`) and
    --only (a regular expression on a row's '<shape> <batch> <layout>')."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes, short warm-up (CPU drivers)")
    parser.add_argument("--repeats", type=int, default=20, help="replays after the warm-up, at most")
    parser.add_argument("--only", default="", help="regular expression on '<shape> <batch> <layout>'")


def shrink(case: Conv2dCase, batch: int, quick: bool) -> Conv2dCase:
    """The case at `batch`; with `quick`, spatial sizes cut to an eighth (at least 4), named."""
    if not quick:
        return dataclasses.replace(case, N=batch)
    h, w = max(4, case.H // 8), max(4, case.W // 8)
    return dataclasses.replace(case, name=f"{case.name} @{h}", N=batch, H=h, W=w)


def time_ours(op, args: tuple, call_bytes: int, s: Settings):
    """Median GPU seconds of one call and of each of its dispatches, and the variants used.

    Returns None when the device has no timestamp queries.
    """
    calls = max(2, min(s.max_calls, STREAM_BYTES // max(1, call_bytes)))
    with Stream() as stream:
        for _ in range(calls):
            op.record(stream, *args)
        stream.run()
        timings = stream.timings()
        if not timings:
            return None
        per_call = len(timings) // calls
        variants = [name for name, _ in timings[:per_call]]
        replay_seconds = warm(stream.replay, s.warmup)
        replays = max(3, min(s.repeats, math.ceil(TIMED_SECONDS / replay_seconds)))
        totals, parts = [], [[] for _ in range(per_call)]
        for _ in range(replays):
            stream.replay()
            seconds = [t for _, t in stream.timings()]
            for i in range(calls):
                call = seconds[i * per_call:(i + 1) * per_call]
                totals.append(sum(call))
                for j, t in enumerate(call):
                    parts[j].append(t)
    return statistics.median(totals), [statistics.median(p) for p in parts], variants


def time_cudnn(case: Conv2dCase, s: Settings) -> float | None:
    """Median seconds of cuDNN fp16 conv2d (channels_last) on the case, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.benchmark = True
    p = case.params
    dev = torch.device("cuda")
    x = torch.randn(p.N, p.C_in, p.H, p.W, device=dev, dtype=torch.half)
    x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(p.C_out, p.Cg, p.KH, p.KW, device=dev, dtype=torch.half) * 0.05
    w = w.contiguous(memory_format=torch.channels_last)
    b = torch.randn(p.C_out, device=dev, dtype=torch.half) if case.bias else None
    conv = torch.nn.functional.conv2d

    def fn(_):
        return conv(x, w, b, case.stride, case.padding, case.dilation, case.groups)

    with torch.no_grad():
        fn(0)  # cudnn.benchmark picks its algorithm here
        torch.cuda.synchronize()
        return time_cuda(fn, 1, s.repeats * s.max_calls, s.warmup)


def fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width}{spec}}"


def tops(macs: int, seconds: float | None) -> float | None:
    return None if not seconds else 2 * macs / seconds / 1e12


def bench_shape(case: Conv2dCase, s: Settings, only: re.Pattern, results: dict,
                record: Results) -> None:
    p = case.params
    chosen = ALGORITHM_NAMES.get(conv2d_algorithm(p), "")
    inputs = make_inputs(case)
    cudnn = None
    ran_cudnn = False
    for short, (name, layout, accepts) in OPS.items():
        if not accepts(p) or not only.search(f"{case.name} {short}"):
            continue
        if short in COOP_KERNELS and COOP_KERNELS[short] not in s.coop:
            continue
        if not ran_cudnn:
            try:
                cudnn = time_cudnn(case, s)
            except RuntimeError as error:  # e.g. out of memory: report, keep going
                print(f"  (cuDNN failed on {case.name}: {str(error).splitlines()[0]})")
            ran_cudnn = True
            record.kernel("conv2d", f"{case.name} b{p.N}", "cuDNN fp16", cudnn, ops=2 * case.macs)
        op = runtime.get_op(name)
        args = list(inputs.args())
        args[0] = Tensor.from_torch(inputs.x, layout=layout, label=f"{case.name} x")
        call_bytes = p.N * p.C_out * p.H_out * p.W_out
        if short == "im2col":
            call_bytes += p.N * p.groups * p.gemm_k * p.H_out * p.W_out
        try:
            measured = time_ours(op, tuple(args), call_bytes, s)
        except runtime.EtvkError as error:
            print(f"{case.name:<34} {p.N:>5} {short:<20} failed: {error}")
            continue
        if measured is None:
            print("device has no timestamp queries: nothing to time")
            sys.exit(1)
        seconds, parts, variants = measured
        # the dot product of the GEMM, or the coop GEMM's K chunk and input loads ("k128_w4")
        dot = "_".join(variants[0].rsplit("_", 2)[1:]) if short in COOP_KERNELS \
            else variants[-1].rsplit("_", 1)[-1]
        label = f"{short}/{dot}" + ("*" if short == chosen else "")
        note = ""
        if short == "im2col" and len(parts) == 2:
            note = f"im2col {parts[0] / seconds:.0%}"
        if short.startswith("dw"):  # bytes moved: the input and output activations (weights are small)
            moved = p.N * p.C_in * (p.H * p.W + p.H_out * p.W_out)
            note = f"{moved / seconds / 1e9:.0f} GB/s" + (f", {moved / seconds / s.copy_rate:.0%} of copy"
                                                         if s.copy_rate else "")
        results[(case.name, p.N, short)] = seconds
        record.kernel("conv2d", f"{case.name} b{p.N}", f"etvk {short}", seconds, ops=2 * case.macs)
        ratio = seconds / cudnn if cudnn else None
        print(f"{case.name:<34} {p.N:>5} {label:<20} {seconds * 1e6:>10.1f} "
              f"{fmt(tops(case.macs, seconds), '.3g', 8)} {fmt(cudnn and cudnn * 1e6, '.1f', 10)} "
              f"{fmt(tops(case.macs, cudnn), '.3g', 8)} {fmt(ratio, '.2f', 11)}  {note}", flush=True)


class _Calls:
    """`time_ours`'s op: ``record(stream, x)`` records one call of `record`."""

    def __init__(self, record):
        self.record = record


def bench_se_pairs(batch: int, s: Settings, only: re.Pattern, record: Results) -> None:
    """The ``effnet se pair`` rows of the module docstring at `batch`."""
    counts = {shape: SE_PAIRS.count(shape) for shape in SE_PAIRS}
    names = {shape: f"effnet se pair {shape[0]}->{shape[1]}->{shape[0]}" for shape in counts}
    chosen = [shape for shape in counts if only.search(names[shape])]
    if not chosen:
        return
    print(f"\n== EfficientNet-B0 squeeze-and-excite gates, batch {batch}: q8ta_conv2d_pw_pair vs two "
          f"q8ta_conv2d (GPU us per call, dispatch timestamps) ==")
    print(f"{'gate':<34} {'count':>5} {'pair':>10} {'two convs':>10} {'pair/two':>9}  variants")
    pair_op, conv = runtime.get_op("etvk.q8ta_conv2d_pw_pair.default"), runtime.get_op("etvk.q8ta_conv2d.default")
    totals = [0.0, 0.0]
    for (c, c_mid) in chosen:
        x, args = make_pw_pair(c, c_mid, c, batch, seed=c, activations=("none", "none"), luts=(True, True))
        first, second = pw_pair_convs(args)
        device_x = Tensor.from_torch(x, layout="4C", label=f"{names[(c, c_mid)]} x")
        pair = _Calls(lambda stream, x, args=args: pair_op.record(stream, x, **args))
        two = _Calls(lambda stream, x, first=first, second=second:
                     conv.record(stream, conv.record(stream, x, **first), **second))
        measured = [time_ours(op, (device_x,), batch * c, s) for op in (pair, two)]
        if None in measured:
            print("device has no timestamp queries: nothing to time")
            sys.exit(1)
        (pair_s, _, pair_variants), (two_s, _, two_variants) = measured
        macs = 2 * batch * c * c_mid
        for label, seconds in (("etvk pw pair", pair_s), ("etvk two q8ta_conv2d", two_s)):
            record.kernel("conv2d", f"{names[(c, c_mid)]} b{batch}", label, seconds, ops=2 * macs)
        totals[0] += counts[(c, c_mid)] * pair_s
        totals[1] += counts[(c, c_mid)] * two_s
        print(f"{names[(c, c_mid)]:<34} {counts[(c, c_mid)]:>5} {pair_s * 1e6:>10.2f} {two_s * 1e6:>10.2f} "
              f"{pair_s / two_s:>9.2f}  {pair_variants[0]}; {', '.join(two_variants)}", flush=True)
    gates = sum(counts[shape] for shape in chosen)
    print(f"{f'all {gates} gates':<34} {'':>5} {totals[0] * 1e6:>10.2f} {totals[1] * 1e6:>10.2f} "
          f"{totals[0] / totals[1]:>9.2f}", flush=True)


def summary(cases: list[Conv2dCase], results: dict) -> None:
    print("\n== im2col vs direct, non-grouped shapes with C_in >= 32 (GPU time per call) ==")
    wins = total = 0
    for case in cases:
        if case.groups != 1 or case.C_in < 32:
            continue
        im2col = results.get((case.name, case.N, "im2col"))
        direct = results.get((case.name, case.N, "direct"))
        if im2col is None or direct is None:
            continue
        total += 1
        wins += im2col < direct
        verdict = (f"im2col {direct / im2col:.2f}x faster" if im2col < direct
                   else f"im2col {im2col / direct:.2f}x slower")
        print(f"{case.name:<34} batch {case.N:>3}: im2col {im2col * 1e6:9.1f} us, "
              f"direct {direct * 1e6:9.1f} us -> {verdict}")
    if total:
        print(f"im2col beats direct on {wins} of {total} shapes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny spatial sizes, batch 1 and 2, short warm-up (CPU drivers)")
    parser.add_argument("--repeats", type=int, default=20,
                        help="replays of each recorded stream after the warm-up, at most (default 20)")
    parser.add_argument("--batches", default=None, help="comma-separated batches (default 1,32; quick 1,2)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of continuous work before timing each row (default 1; quick 0.05)")
    parser.add_argument("--only", default="", help="regular expression on '<layer> <op>', e.g. 'l4|dw'")
    options = parser.parse_args()
    started = time.perf_counter()
    caps = open_device()
    if caps is None:
        return 1
    batches = [int(b) for b in (options.batches or ("1,2" if options.quick else "1,32")).split(",")]
    warmup = options.warmup if options.warmup is not None else (0.05 if options.quick else 1.0)
    s = Settings(repeats=3 if options.quick and options.repeats == 20 else options.repeats,
                 warmup=warmup, max_calls=2 if options.quick else MAX_CALLS,
                 coop=coop_gemm_kernels(caps))
    only = re.compile(options.only)
    copy = cuda_copy_seconds(COPY_BYTES, s.repeats, s.warmup)
    s.copy_rate = 2 * COPY_BYTES / copy if copy else None
    if s.copy_rate:
        print(f"torch CUDA copy of {COPY_BYTES >> 20} MiB: {s.copy_rate / 1e9:.0f} GB/s read + written")
    print(f"\n== int8 conv ops vs cuDNN fp16, median GPU time per call ({s.max_calls} back-to-back "
          f"calls per stream, <= {s.repeats} replays after {s.warmup:g} s warm-up each) ==")
    print("op: algorithm/dot of the default variant (coop: the cooperative-matrix GEMM's chunk and "
          "loads); * = what etvk.q8ta_conv2d.default picks here. ours/cuDNN: GPU time ratio "
          "(< 1: ours faster)")
    if not s.coop:
        print("(no _coop rows: this device does not run the cooperative-matrix GEMMs)")
    print(f"{'layer':<34} {'batch':>5} {'op':<20} {'GPU us':>10} {'TOPS':>8} {'cuDNN us':>10} "
          f"{'TOPS':>8} {'ours/cuDNN':>11}  note")
    results: dict = {}
    record = Results("conv2d")
    record.device(caps)
    cases = []
    for batch in batches:
        for shape in SHAPES:
            case = shrink(shape, batch, options.quick)
            cases.append(case)
            bench_shape(case, s, only, results, record)
    for batch in batches:
        bench_se_pairs(batch, s, only, record)
    summary(cases, results)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
