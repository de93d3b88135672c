"""Runtime benchmark (not a test): host overhead of small calls, copy bandwidth, quantize throughput.

Prints, on the default device (``ETVK_DEVICE`` picks another):

1. Host overhead of small dispatches (64 values, quantize_per_tensor): a
   fresh single-op call (``op(x, ...)`` on a host tensor: upload, record,
   submit, wait, download) with its call plan replayed, with call plans off
   (``ETVK_CALL_PLANS=0``) and with recordings made afresh too; its
   recording alone (no submit) with the kept recording reused and recorded
   afresh every call (the device's ``recordings.reuse``,
   ``ETVK_REUSE_RECORDINGS=0``); the pieces of the
   call (plan key, upload, output, download, its torch.empty), the replay of that one recorded
   dispatch, and the replay of a stream of 100 such dispatches (per
   dispatch). Host time is the wall time less the GPU time from timestamp
   queries in the same run (for 100 dispatches: from the first one's start
   to the last one's end). Then 100 dispatches recorded without timestamps,
   as loaded programs replay them (wall time per dispatch): independent ones
   (no barrier between them) and a chain each reading the one before (a
   barrier before each), the chain also with timestamps.
2. The device's copy bandwidth (vkCmdCopyBuffer of a large buffer, bytes
   read + written), the yardstick of the report.
3. Throughput of every quantize-family variant in GB/s (bytes read + written
   over the GPU time from timestamp queries), then of the conv family's
   ``q8ta_quantize`` and ``q8ta_dequantize`` (fp <-> packed int8) on a
   [1, 64, S, S] activation in each packed layout x storage x fp dtype, rows
   named ``q8ta_quantize 4C1W buffer float32`` (op, layout, storage, dtype;
   the serving variant printed beside), so runs before and after a change
   of their variants compare row by row.
4. With CUDA available (the NVIDIA machine): ``torch.quantize_per_tensor`` on
   CUDA on the same tensor, timed with CUDA events in the same run, and the
   ratio of our per-tensor quantize to it; and dynamic per-token quantization
   (``choose_qparams_per_token_asymmetric`` then ``quantize_per_token``, fp32
   and fp16, [64Ki, 1024]; ours as the two ops and as the fused
   ``quantize_per_token_dynamic``) against ``torch.compile`` of the same two
   ops (their eager torch math, compiled; CUDA events), timed in turn over three
   rounds (ours on new memory each round): medians, ranges and their ratio.
5. With ``--sweep``, instead of 3 and 4: every quantize / dequantize variant with 1, 2, 4 and 8
   units of 4 values (buffer) or texels (texture3d) per invocation (the
   shaders' UNITS; the ops use op_specs/quantize.yaml's choice), rows back to
   back in one run, and the fastest per variant; every choose_qparams and fused dynamic
   quantize variant at each (workgroup size, LANES) of quantize_tunables.TEAMS, with
   REDUCERS 4 and 8 (choose_qparams) or the REGS that hold a 1024-value token.

With ``ETVK_BENCH_RESULTS=DIR`` it also writes DIR/runtime.jsonl
(benchmarks/results.py) for benchmarks/report.py.

Usage: ``python benchmarks/runtime_bench.py [--quick] [--elements N] [--repeats R] [--only REGEX]
[--sweep]``
(``--quick``: tiny sizes and short warm-ups; runs on lavapipe in seconds.)
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from copy_bandwidth import copy_seconds  # noqa: E402
from results import Results  # noqa: E402
from timing import cuda_copy_seconds, time_cuda, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.ops.plans import plan_key, plans_for  # noqa: E402
from runtime.tools.examples import EXAMPLES  # noqa: E402
from runtime.tools.quantize_tunables import (  # noqa: E402
    CANDIDATES,
    CHOOSE_CANDIDATES,
    DYNAMIC_CANDIDATES,
    UnitsStream,
    record_token_shader,
)
from runtime.vulkan.device import FENCE_SPIN_US, get_device  # noqa: E402
from runtime.vulkan.layouts import PACKED_LAYOUTS, packed_words  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor, dtype_info  # noqa: E402

QUANTIZE = "etvk.quantize_per_tensor.default"
CHOOSE = "etvk.choose_qparams_per_token_asymmetric.default"
DYNAMIC = "etvk.quantize_per_token_dynamic.default"
QUANTIZE_ARGS = (0.05, 0, -128, 127, torch.int8)
BACK_TO_BACK = 8  # dispatches per submitted stream in the throughput runs
REPLAYED = 100  # small dispatches in the recorded stream of the overhead section
# Continuous work before timing each variant. GPUs drop their clocks while the
# host prepares the next inputs (an H100 idles at 360 MHz), and short timed
# bursts do not ramp them back: without this, variants timed later in the run
# looked up to 4x slower than the same dispatch timed first.
WARMUP_SECONDS = 1.0
# Warm-up per --sweep row: the rows of one variant run back to back, so the clock is
# already up; the first row of a variant follows the host's preparation of its inputs.
SWEEP_WARMUP_SECONDS = 0.2
SWEEP_FIRST_WARMUP_SECONDS = 0.5
DYNAMIC_ROUNDS = 3  # interleaved rounds of the dynamic quantize comparison


def median_us(fn, repeats: int, warmup: float, gpu=None) -> tuple[float, float, float]:
    """Microseconds of `fn()` over `repeats` calls after `warmup` seconds of calls: the median
    wall time, the median of `gpu()` (GPU seconds of the call just made, read outside the timed
    part) and the mean CPU time of this thread (a CPU driver's own threads not counted)."""
    warm(fn, warmup)
    wall, device, cpu = [], [], 0.0
    for _ in range(repeats):
        start_cpu = time.thread_time()  # a system call: outside the wall-clock window
        start = time.perf_counter()
        fn()
        wall.append(time.perf_counter() - start)
        cpu += time.thread_time() - start_cpu
        if gpu is not None:
            device.append(gpu())
    return (statistics.median(wall) * 1e6, statistics.median(device or [float("nan")]) * 1e6,
            cpu / repeats * 1e6)


def overhead(repeats: int, warmup: float, results: Results) -> None:
    """Prints (and emits) the host time of a fresh op call and of replayed small dispatches."""
    op = runtime.get_op(QUANTIZE)
    x = torch.randn(64)
    with Stream() as one, Stream() as hundred:
        op.record(one, x, *QUANTIZE_ARGS)
        for _ in range(REPLAYED):
            op.record(hundred, x, *QUANTIZE_ARGS)
        one.run()
        hundred.run()
        if one.gpu_seconds() is None:
            print("\n(device has no timestamp queries: overhead section skipped)")
            return
        replay_us, gpu_us, replay_cpu = median_us(one.replay, repeats, warmup, one.gpu_seconds)
        device, spin = get_device(), get_device().fence_spin
        device.fence_spin = 0.0 if spin else FENCE_SPIN_US * 1e-6  # the other way to wait
        other_us, _, other_cpu = median_us(one.replay, repeats, warmup)
        device.fence_spin = spin
        hundred_us, hundred_gpu_us, hundred_cpu = median_us(hundred.replay, repeats, warmup,
                                                            hundred.gpu_seconds)
        untimed = replayed_without_timestamps(op, x, repeats, warmup)
    fresh, record_only = fresh_calls(op, x, repeats, warmup)
    fresh_us = fresh["plan"][0]
    afresh = "  the same, recorded afresh (ETVK_REUSE_RECORDINGS=0)"
    rows = [  # (what, wall us, GPU us, CPU us, dispatches); the fresh call's GPU time is the replay's
        ("fresh op call (upload, record, submit, wait, download)", fresh["plan"][0], gpu_us,
         fresh["plan"][1], 1),
        ("  the same, call plans off (ETVK_CALL_PLANS=0)", fresh["reuse"][0], gpu_us,
         fresh["reuse"][1], 1),
        (afresh + " too", fresh["afresh"][0], gpu_us, fresh["afresh"][1], 1),
        ("record only (stub + finish, no submit)", record_only["reuse"][0], 0.0,
         record_only["reuse"][1], 1),
        (afresh, record_only["afresh"][0], 0.0, record_only["afresh"][1], 1),
        *call_pieces(x, repeats, warmup),
        ("1 recorded dispatch, replayed (submit + wait)", replay_us, gpu_us, replay_cpu, 1),
        ("  the same, " + ("blocking wait only" if spin else f"fence polled for up to {FENCE_SPIN_US} us"),
         other_us, gpu_us, other_cpu, 1),
        (f"{REPLAYED} small dispatches recorded, replayed", hundred_us, hundred_gpu_us, hundred_cpu,
         REPLAYED),
        *untimed]
    print(f"\n== Host overhead of small dispatches (64 values, quantize_per_tensor), median of {repeats}; "
          f"fences polled for up to {spin * 1e6:.0f} us before blocking (ETVK_FENCE_SPIN_US) ==")
    print("host us = (wall - GPU time from timestamps, median over the same calls) per dispatch; "
          "CPU us: this thread's CPU time per call")
    print(f"{'path':<56} {'wall us':>9} {'GPU us':>9} {'CPU us':>9} {'host us/dispatch':>17}")
    for what, wall, gpu, cpu, dispatches in rows:
        host = (wall - gpu) / dispatches
        print(f"{what:<56} {wall:>9.1f} {gpu:>9.1f} {cpu:>9.1f} {host:>17.2f}")
        results.emit("overhead", case=what, wall_us=wall, gpu_us=gpu, cpu_us=cpu, host_us=host,
                     dispatches=dispatches)
    print(f"fresh call / replay of the same dispatch (wall) = {fresh_us / replay_us:.2f}")


def replayed_without_timestamps(op, x, repeats: int, warmup: float) -> list[tuple]:
    """Overhead rows of `REPLAYED` small dispatches in streams recorded without timestamps (as a
    loaded program replays them; GPU time unknown, counted 0): independent ones (no barrier
    between them), and a chain of ``etvk.scalar`` ops each reading the one before (a barrier
    before each), with and without timestamps."""
    scalar = runtime.get_op("etvk.scalar.default")
    rows = []
    for label, timestamps, chain in (("independent dispatches, no timestamps", False, False),
                                     ("chained dispatches (barriers), no timestamps", False, True),
                                     ("chained dispatches (barriers), with timestamps", True, True)):
        with Stream(timestamps=timestamps) as stream:
            value = Tensor.from_torch(torch.randn(64))
            for _ in range(REPLAYED):
                if chain:
                    value = scalar.record(stream, value, 1.0, "mul")
                else:
                    op.record(stream, x, *QUANTIZE_ARGS)
            stream.run()
            wall, _, cpu = median_us(stream.replay, repeats, warmup)
        rows.append((f"  {REPLAYED} {label}", wall, 0.0, cpu, REPLAYED))
    return rows


# How a fresh call may reuse earlier work: (call plans on, recordings reused).
FRESH_MODES = {"plan": (True, True), "reuse": (False, True), "afresh": (False, False)}


def fresh_calls(op, x, repeats: int, warmup: float) -> tuple[dict, dict]:
    """(median wall us, mean thread-CPU us) of a fresh op call on `x` and of recording
    it alone (a stream opened, the stub recorded, finished, closed) in each of `FRESH_MODES`
    ("plan": the call plan replayed; "reuse": recorded through the stream, whose kept recording
    of the same dispatches is reused; "afresh": recorded afresh), alternated twice and the lower
    of the two kept; recording alone has no "plan" entry (plans serve op calls only)."""
    def record_only():
        with Stream() as stream:
            op.record(stream, x, *QUANTIZE_ARGS)
            stream.finish()

    device = get_device()
    recordings, call_plans = device.recordings, plans_for(device)
    saved = (call_plans.enabled, recordings.reuse)
    fresh, record = {}, {}
    try:
        for mode in (*FRESH_MODES, *FRESH_MODES):
            call_plans.enabled, recordings.reuse = FRESH_MODES[mode]
            for table, fn in ((fresh, lambda: op(x, *QUANTIZE_ARGS)), (record, record_only)):
                if table is record and mode == "plan":
                    continue
                wall, _, cpu = median_us(fn, repeats // 2, warmup / 2)
                old = table.get(mode, (wall, cpu))
                table[mode] = (min(wall, old[0]), min(cpu, old[1]))
    finally:
        call_plans.enabled, recordings.reuse = saved
    return fresh, record


def call_pieces(x, repeats: int, warmup: float) -> list[tuple]:
    """Rows (what, wall us, GPU us (0), CPU us, 1) of the host pieces of a fresh call on `x`:
    the call plan's key, the upload, the output tensor (in host memory, as an op call's small
    outputs are), the download and the torch tensor it makes."""
    out = Tensor.empty(x.shape, QUANTIZE_ARGS[-1], placement="host")
    pieces = (("  piece: call plan key (plan_key)", lambda: plan_key((x, *QUANTIZE_ARGS), {})),
              ("  piece: upload (Tensor.from_torch)", lambda: Tensor.from_torch(x)),
              ("  piece: output (Tensor.empty)",
               lambda: Tensor.empty(x.shape, QUANTIZE_ARGS[-1], placement="host")),
              ("  piece: download (Tensor.to_torch)", out.to_torch),
              ("  piece: torch.empty of the result (in the download)",
               lambda: torch.empty(out.shape, dtype=out.dtype)))
    rows = []
    for what, fn in pieces:
        wall, _, cpu = median_us(fn, repeats, warmup / 2)
        rows.append((what, wall, 0.0, cpu, 1))
    return rows


def copy_bandwidth(nbytes: int, repeats: int, warmup: float, results: Results) -> float | None:
    """Prints (and emits) the device-to-device copy bandwidth in GB/s (bytes read + written)."""
    seconds = copy_seconds(get_device(), nbytes, warmup, repeats)
    if seconds is None:
        print("\n(device has no timestamp queries: copy bandwidth skipped)")
        return None
    gbps = 2 * nbytes / seconds / 1e9
    print(f"\n== Copy bandwidth: vkCmdCopyBuffer of {nbytes / 2**20:.0f} MiB, median of {repeats} x 8 "
          "(timestamps) ==")
    print(f"{'copy (bytes read + written)':<50} {2 * nbytes / 1e6:>9.2f} {seconds * 1e6:>9.1f} {gbps:>8.1f}")
    results.emit("copy", bytes=2 * nbytes, seconds=seconds, how="vkCmdCopyBuffer")
    cuda = cuda_copy_seconds(nbytes, repeats, warmup)
    if cuda is not None:
        print(f"{'torch CUDA copy_ (bytes read + written)':<50} {2 * nbytes / 1e6:>9.2f} "
              f"{cuda * 1e6:>9.1f} {2 * nbytes / cuda / 1e9:>8.1f}")
        results.emit("copy", bytes=2 * nbytes, seconds=cuda, how="torch CUDA copy_")
        gbps = max(gbps, 2 * nbytes / cuda / 1e9)
    return gbps


def gpu_seconds(stream: Stream, repeats: int, warmup: float) -> float:
    """Median GPU time of one dispatch over `repeats` replays, after `warmup` seconds of replays."""
    warm(stream.replay, warmup)
    samples = []
    for _ in range(repeats):
        stream.replay()
        samples += [seconds for _, seconds in stream.timings()]
    return statistics.median(samples)


def throughput(elements: int, repeats: int, warmup: float, only: re.Pattern,
               results: Results) -> float | None:
    """Prints GB/s per quantize-family variant; returns per-tensor int8 fp32 buffer GB/s."""
    caps = get_device().caps
    gen = torch.Generator().manual_seed(0)
    shape = (max(1, elements >> 20), min(elements, 1024), max(1, min(elements >> 10, 1024)))
    print(f"\n== Throughput, {'x'.join(map(str, shape))} values, median of {repeats} x {BACK_TO_BACK} "
          f"back-to-back dispatches (timestamps), after {warmup:g} s of warm-up each ==")
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
                seconds = gpu_seconds(stream, repeats, warmup)
            moved = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
            moved += sum(o.nbytes for o in outputs)
            gbps = moved / seconds / 1e9
            if info.name == "quantize_per_tensor_buffer_float_int8":
                baseline = gbps
            print(f"{info.name:<50} {moved / 1e6:>9.2f} {seconds * 1e6:>9.1f} {gbps:>8.1f}", flush=True)
            results.kernel("quantize", info.name, "etvk", seconds, moved)
    return baseline


def packed_shape(elements: int) -> tuple[int, int, int, int]:
    """An [N, C, H, W] conv activation of about `elements` values: 64 channels (4 when
    fewer than 256 values), a square image."""
    channels = 64 if elements >= 256 else 4
    side = max(1, math.isqrt(elements // channels))
    return (1, channels, side, side)


def packed_throughput(elements: int, repeats: int, warmup: float, only: re.Pattern,
                      results: Results) -> None:
    """Prints GB/s of q8ta_quantize and q8ta_dequantize (fp <-> packed int8, the conv
    family's edges) in each packed layout, storage and fp dtype. A row is named by the op
    and its arguments, not by the variant that serves it (printed next to it)."""
    shape = packed_shape(elements)
    print(f"\n== Packed int8 quantize / dequantize, {'x'.join(map(str, shape))} values, median of "
          f"{repeats} x {BACK_TO_BACK} back-to-back dispatches (timestamps), after {warmup:g} s of "
          "warm-up each ==")
    print(f"{'case':<44} {'variant':<36} {'MB moved':>9} {'GPU us':>9} {'GB/s':>8}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen) * 3
    q = torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)
    for name in ("q8ta_quantize", "q8ta_dequantize"):
        op = runtime.get_op(f"etvk.{name}.default")
        for layout in PACKED_LAYOUTS:
            packed_bytes = 4 * packed_words(shape, layout)
            for storage in ("buffer", "texture3d"):
                for dtype in (torch.float32, torch.float16):
                    case = f"{name} {layout} {storage} {str(dtype).split('.')[-1]}"
                    if not only.search(case):
                        continue
                    if name == "q8ta_quantize":
                        args, kwargs = (Tensor.from_torch(x, storage, dtype), 0.05, -3, layout), {}
                    else:
                        args, kwargs = (Tensor.from_torch(q, layout=layout), 0.05, -3), {"out_dtype": dtype}
                    with Stream() as stream:
                        for _ in range(BACK_TO_BACK):
                            op.record(stream, *args, **kwargs, storage=storage)
                        stream.run()
                        if not stream.timings():
                            print("device has no timestamp queries; skipping packed throughput")
                            return
                        variant = stream.timings()[0][0]
                        seconds = gpu_seconds(stream, repeats, warmup)
                    moved = x.numel() * dtype.itemsize + packed_bytes
                    print(f"{case:<44} {variant:<36} {moved / 1e6:>9.2f} {seconds * 1e6:>9.1f} "
                          f"{moved / seconds / 1e9:>8.1f}", flush=True)
                    results.kernel("q8ta_quantize", case, "etvk", seconds, moved)


@torch.compile
def _dynamic_quantize(x: torch.Tensor) -> torch.Tensor:
    """The reference's choose_qparams_per_token_asymmetric then quantize_per_token."""
    from runtime.reference import quantize as ref

    scales, zero_points = ref.choose_qparams_per_token_asymmetric(x, torch.int8)
    return ref.quantize_per_token(x, scales, zero_points, -128, 127, torch.int8)


def compiled_dynamic_quantize(x: torch.Tensor, _: int) -> torch.Tensor:
    return _dynamic_quantize(x)


def time_dynamic_ours(x: torch.Tensor, repeats: int, warmup: float, keep: list) -> tuple[float, float]:
    """GPU seconds per call of ours on a new device copy of `x`: as choose_qparams +
    quantize_per_token (two dispatches) and as the fused quantize_per_token_dynamic. Every
    device tensor made goes to `keep`: while the caller holds them, the next call's tensors
    get new memory instead of these (the device recycles freed memory)."""
    choose = runtime.get_op(CHOOSE)
    quantize = runtime.get_op("etvk.quantize_per_token.default")
    fused = runtime.get_op(DYNAMIC)
    device_x = Tensor.from_torch(x)
    keep.append(device_x)
    with Stream() as stream:
        for _ in range(BACK_TO_BACK):
            scales, zero_points = choose.record(stream, device_x, torch.int8)
            keep += [scales, zero_points, quantize.record(stream, device_x, scales, zero_points,
                                                          -128, 127, torch.int8)]
        stream.run()
        warm(stream.replay, warmup)
        samples = []
        for _ in range(repeats):
            stream.replay()
            pair = [seconds for _, seconds in stream.timings()]
            samples += [a + b for a, b in zip(pair[::2], pair[1::2], strict=True)]
    with Stream() as stream:
        for _ in range(BACK_TO_BACK):
            keep += fused.record(stream, device_x, torch.int8)
        stream.run()
        return statistics.median(samples), gpu_seconds(stream, repeats, warmup)


def median_cell(values: list[float], width: int) -> str:
    """`median (low-high)` in µs, right-aligned in `width` characters."""
    text = f"{statistics.median(values) * 1e6:.1f} ({min(values) * 1e6:.1f}-{max(values) * 1e6:.1f})"
    return f"{text:>{width}}"


def dynamic_quantize(repeats: int, warmup: float, quick: bool, results: Results) -> None:
    """Dynamic per-token int8 quantization of [64Ki, 1024] fp32 and fp16 values, GPU time per
    call: ours as choose_qparams + quantize_per_token (two dispatches) and as the fused
    quantize_per_token_dynamic, against torch.compile of the same two ops on CUDA (same run).

    Ours and torch.compile are timed in turn, DYNAMIC_ROUNDS times (ours on new memory each
    round), and each reports its median round: one round of ours swings by a few percent with
    where its tensors land, and a first measurement with the clocks (NOTES, session 6)."""
    shape = (64, 64) if quick else (64 << 10, 1024)
    rounds = 1 if quick else DYNAMIC_ROUNDS
    print(f"\n== Dynamic per-token int8 quantization (choose_qparams + quantize_per_token), "
          f"{shape[0]}x{shape[1]}: GPU us per call, median (range) of {rounds} interleaved "
          f"rounds; GB/s counts one read of x, q, scales, zps ==")
    print(f"{'dtype':<8} {'two ops us':>22} {'fused us':>22} {'GB/s':>8} {'torch.compile us':>22} "
          f"{'fused/compile':>14}")
    for dtype in (torch.float32, torch.float16):
        x = (torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3).to(dtype)
        moved = x.numel() * (x.element_size() + 1) + shape[0] * 8  # what a fused kernel must move
        two_ops, fused, compiled = [], [], []
        compile_error = None
        keep: list = []  # every round's device tensors, until the dtype's rounds are done
        compile_call = (functools.partial(compiled_dynamic_quantize, x.cuda())
                        if torch.cuda.is_available() else None)
        for _ in range(rounds):
            pair = time_dynamic_ours(x, repeats, warmup, keep)
            two_ops.append(pair[0])
            fused.append(pair[1])
            if compile_call is not None and compile_error is None:
                try:
                    compiled.append(time_cuda(compile_call, 1, repeats * BACK_TO_BACK, warmup))
                except Exception as error:  # noqa: BLE001 - a compile failure is reported, not fatal
                    compile_error = f"n/a ({type(error).__name__}: {str(error).splitlines()[0][:80]})"
        what = f"choose_qparams + quantize_per_token {str(dtype).split('.')[-1]}"
        ours = statistics.median(fused)
        results.kernel("dynamic quantize", what, "etvk two ops", statistics.median(two_ops), moved)
        results.kernel("dynamic quantize", what, "etvk fused", ours, moved)
        versus = f"{compile_error or 'n/a (no CUDA)':>22}"
        if compiled:
            seconds = statistics.median(compiled)
            results.kernel("dynamic quantize", what, "torch.compile", seconds, moved)
            versus = f"{median_cell(compiled, 22)} {ours / seconds:>14.2f}"
        print(f"{str(dtype).split('.')[-1]:<8} {median_cell(two_ops, 22)} {median_cell(fused, 22)} "
              f"{moved / ours / 1e9:>8.1f} {versus}", flush=True)


def sweep_units(elements: int, repeats: int, warmup: float, only: re.Pattern) -> None:
    """GPU time of every quantize / dequantize variant at each UNITS candidate (units of 4
    values, or texels, per invocation), one row after another in one run."""
    caps = get_device().caps
    gen = torch.Generator().manual_seed(0)
    shape = (max(1, elements >> 20), min(elements, 1024), max(1, min(elements >> 10, 1024)))
    print(f"\n== Units (buffer) or texels (texture3d) per invocation, {'x'.join(map(str, shape))} "
          f"values, median of {repeats} x {BACK_TO_BACK}, rows back to back after "
          f"{min(warmup, SWEEP_WARMUP_SECONDS):g} s of warm-up each "
          f"({min(warmup, SWEEP_FIRST_WARMUP_SECONDS):g} s a variant's first) ==")
    print(f"{'variant':<50} {'UNITS':>5} {'GPU us':>9} {'GB/s':>8}")
    for name in ("etvk.quantize_per_tensor.default", "etvk.quantize_per_token.default",
                 "etvk.dequantize_per_tensor.default", "etvk.dequantize_per_token.default"):
        op = runtime.get_op(name)
        for info in op.variants:
            if not only.search(info.name) or not info.runnable(caps)[0]:
                continue
            args, kwargs = EXAMPLES[name](info.axes, shape, gen)
            # Tensors uploaded once, bound as they are by every candidate's recording.
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            moved = sum(a.numel() * a.element_size() for a in tensors)
            device = {}
            for binding, value in zip(("t_in", "t_scales", "t_zero_points")[:len(tensors)], tensors,
                                      strict=True):
                where = info.binding(binding)
                device[id(value)] = Tensor.from_torch(value, where.storage,
                                                      dtype_info(where.dtype).torch_dtype)
            args = tuple(device.get(id(a), a) for a in args)
            timed = []
            for units in CANDIDATES:
                with UnitsStream(units) as stream:
                    for _ in range(BACK_TO_BACK):
                        out = op.record(stream, *args, **kwargs, variant=info.name)
                    stream.run()
                    row_warmup = SWEEP_WARMUP_SECONDS if timed else SWEEP_FIRST_WARMUP_SECONDS
                    seconds = gpu_seconds(stream, repeats, min(warmup, row_warmup))
                gbps = (moved + out.nbytes) / seconds / 1e9
                timed.append((seconds, units))
                mark = "  (the op's choice)" if units == stream.chosen else ""
                print(f"{info.name:<50} {units:>5} {seconds * 1e6:>9.1f} {gbps:>8.1f}{mark}", flush=True)
            print(f"{'':<50} best UNITS={min(timed)[1]}")


def sweep_tokens(elements: int, repeats: int, warmup: float, only: re.Pattern) -> None:
    """GPU time of every per-token shader variant (choose_qparams, the fused dynamic quantize)
    at each (workgroup size, LANES, REDUCERS or REGS) candidate."""
    caps = get_device().caps
    shape = (max(1, elements >> 10), min(elements, 1024))
    print(f"\n== Per-token shaders, workgroup size x LANES x REDUCERS (choose_qparams) or REGS "
          f"(dynamic quantize), {shape[0]}x{shape[1]} values, rows back to back ==")
    print(f"{'variant':<50} {'WG':>4} {'LANES':>5} {'R':>3} {'GPU us':>9} {'GB/s':>8}")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    for op, name, candidates in ((CHOOSE, "REDUCERS", CHOOSE_CANDIDATES),
                                 (DYNAMIC, "REGS", DYNAMIC_CANDIDATES)):
        for info in runtime.get_op(op).variants:
            if not only.search(info.name) or not info.runnable(caps)[0]:
                continue
            typed = x.to(dtype_info(info.binding("t_in").dtype).torch_dtype)
            if info.axes["STORAGE"] == "texture3d":  # tokens as rows of image layers: within the limits
                typed = typed.reshape(-1, min(shape[0], 1024), shape[1])
            device_x = Tensor.from_torch(typed, info.axes["STORAGE"])
            moved = typed.numel() * typed.element_size() + shape[0] * 8
            if op == DYNAMIC:
                moved += typed.numel()  # the int8 output
            timed = []
            for workgroup, lanes, value in candidates:
                with Stream() as stream:
                    for _ in range(BACK_TO_BACK):
                        record_token_shader(stream, info, op, device_x, workgroup, lanes,
                                            {name: value})
                    stream.run()
                    row_warmup = SWEEP_WARMUP_SECONDS if timed else SWEEP_FIRST_WARMUP_SECONDS
                    seconds = gpu_seconds(stream, repeats, min(warmup, row_warmup))
                timed.append((seconds, workgroup, lanes, value))
                print(f"{info.name:<50} {workgroup:>4} {lanes:>5} {value:>3} {seconds * 1e6:>9.1f} "
                      f"{moved / seconds / 1e9:>8.1f}", flush=True)
            best = min(timed)
            print(f"{'':<50} best workgroup={best[1]} LANES={best[2]} {name}={best[3]}")


def cuda_baseline(elements: int, repeats: int, warmup: float, ours_gbps: float | None,
                  results: Results) -> None:
    if not torch.cuda.is_available():
        print("\n(no CUDA device: torch.quantize_per_tensor comparison skipped)")
        return
    x = torch.randn(elements, device="cuda")

    def quantize():
        torch.quantize_per_tensor(x, 0.05, 0, torch.qint8)
        torch.cuda.synchronize()

    warm(quantize, warmup)
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
    results.kernel("quantize", "quantize_per_tensor_buffer_float_int8", "torch CUDA", seconds, elements * 5)
    if ours_gbps:
        print(f"ours (quantize_per_tensor_buffer_float_int8) / torch CUDA = {ours_gbps / gbps:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes (4Ki values, 1 MiB copy), 3 repeats, 0.05 s warm-ups")
    parser.add_argument("--elements", type=int, default=None,
                        help="values per tensor (default: 64Mi on a GPU, 4Mi on a CPU device)")
    parser.add_argument("--repeats", type=int, default=None, help="timed replays (default 20; quick 3)")
    parser.add_argument("--only", default="", help="regular expression: time only matching variants "
                        "(the q8ta rows: matching case names)")
    parser.add_argument("--skip-overhead", action="store_true", help="skip the overhead section")
    parser.add_argument("--sweep", action="store_true",
                        help="instead of the throughput sections, time quantize / dequantize variants at "
                        "1, 2, 4 and 8 units per invocation, choose_qparams at each workgroup size "
                        "and REDUCERS")
    options = parser.parse_args()
    try:
        caps = get_device().caps
    except runtime.VulkanUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    cpu = caps.family in ("llvmpipe", "swiftshader")
    elements = options.elements or (4096 if options.quick else 4 << 20 if cpu else 64 << 20)
    repeats = options.repeats or (3 if options.quick else 20)
    warmup = 0.05 if options.quick else WARMUP_SECONDS
    results = Results("runtime")
    results.device(caps)
    print(f"device: {caps.name} (family {caps.family})", flush=True)
    if not options.skip_overhead:
        overhead(repeats * 10, min(warmup, 0.2), results)
    copy_bandwidth(1 << 20 if options.quick else 64 << 20 if cpu else 1 << 30, repeats, warmup, results)
    only = re.compile(options.only)
    if options.sweep:  # instead of the throughput and comparison sections: under 2 minutes
        sweep_units(elements, repeats, warmup, only)
        sweep_tokens(elements, repeats, warmup, only)
        return 0
    ours = throughput(elements, repeats, warmup, only, results)
    packed_throughput(elements, repeats, warmup, only, results)
    if only.search("quantize_per_tensor_buffer_float_int8"):  # the variant the CUDA baseline is beside
        cuda_baseline(elements, repeats, warmup, ours, results)
    if only.search("choose_qparams") or only.search("quantize_per_token"):
        dynamic_quantize(repeats, warmup, options.quick, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
