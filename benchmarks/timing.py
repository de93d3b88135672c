"""Timing helpers shared by the kernel benchmarks (conv2d_bench.py, linear_bench.py).

`warm` keeps the host (and so the GPU) busy for a while before timing, since
an idle NVIDIA GPU drops its clock (benchmarks/NOTES.md); `median_seconds` times a call by
wall clock after such a warm-up; `time_cuda` times a
torch baseline with CUDA events, its calls queued behind a GPU spin so that
host launch overhead stays outside the events; `open_device` prints the
Vulkan and CUDA devices; `drop_validation` keeps the validation layer out of
the timings. No Vulkan recording here: each benchmark times its
own streams.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import runtime
from runtime.vulkan.device import get_device


def drop_validation() -> None:
    """Timings are taken without the validation layer: drops ETVK_VALIDATION (with a note when
    it asked for the layer) before the benchmark opens its device."""
    if os.environ.get("ETVK_VALIDATION", "0") not in ("", "0"):
        print("note: ETVK_VALIDATION ignored: timings are taken without validation")
    os.environ.pop("ETVK_VALIDATION", None)


def warm(fn, seconds: float) -> float:
    """Calls `fn` for `seconds` of wall time; returns seconds per call."""
    count, start = 0, time.perf_counter()
    end = start + seconds
    while True:
        fn()
        count += 1
        now = time.perf_counter()
        if now >= end:
            return (now - start) / count


def median_seconds(fn, repeat: int, warmup: float) -> float:
    """Median wall seconds of `repeat` calls of ``fn()`` after `warmup` seconds of calls."""
    warm(fn, warmup)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_cuda(fn, variants: int, calls: int, warmup: float) -> float:
    """Median seconds of ``fn(i)`` on CUDA (``i`` cycles over ``variants`` inputs, e.g.
    weight copies): warmed for `warmup` s, then `calls` calls timed with CUDA events."""
    burst_calls = max(8, 4 * variants)

    def burst():
        for i in range(burst_calls):
            fn(i % variants)
        torch.cuda.synchronize()

    per_call = warm(burst, warmup) / burst_calls  # host or GPU time per call, the longer
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(calls)]
    if hasattr(torch.cuda, "_sleep"):  # a GPU spin (cycles at <= ~2 GHz) while the calls queue
        torch.cuda._sleep(int(min(2.0, 2 * calls * per_call + 5e-3) * 2e9))
    for i, (start, end) in enumerate(events):
        start.record()
        fn(i % variants)
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events) / 1e3


def cuda_copy_seconds(nbytes: int, repeats: int, warmup: float) -> float | None:
    """Median seconds of a torch CUDA copy of `nbytes` bytes (the copy kernel CUDA runs: a
    compute copy, not a DMA engine's), or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    source = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    destination = torch.empty_like(source)
    return time_cuda(lambda i: destination.copy_(source), 1, repeats, warmup)


def open_device():
    """The Vulkan device's capabilities after printing both devices, or None (and a line on
    stderr saying what to install) when there is no Vulkan."""
    try:
        caps = get_device().caps
    except runtime.VulkanUnavailable as error:
        print(error, file=sys.stderr)
        return None
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "n/a (no CUDA)"
    print(f"device: {caps.name} (family {caps.family}); torch {torch.__version__} CUDA device: {cuda}")
    return caps
