"""``python -m runtime demo``: every op's variants on the default device.

Runs each generated variant once on the example arguments of
`runtime.tools.examples`, compares with the op's PyTorch reference and prints one
row per variant as it finishes: op, variant, device, max error, wall-clock µs
per eager call (upload + dispatch + download) and GPU µs from timestamps.
Called by ``runtime/__main__.py``; it adds no behaviour of its own to ops.
"""

from __future__ import annotations

import statistics
import time

import torch

from runtime.ops.registry import get_op, list_ops
from runtime.tools.examples import EXAMPLES, tolerance
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

DEMO_SHAPE = (64, 1000)
REPEATS = 5


def max_error(got, want) -> float:
    """Largest absolute difference over all outputs (integer outputs: in steps)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf")
        if g.numel():
            diff = (g.to(torch.float64) - w.to(torch.float64)).abs().max().item()
            worst = max(worst, diff)
    return worst


def _gpu_seconds(op, args, kwargs, variant) -> float | None:
    with Stream() as stream:
        op.record(stream, *args, **kwargs, variant=variant)
        stream.run()
        timings = stream.timings()
    return sum(seconds for _, seconds in timings) if timings else None


def run_demo(shape=DEMO_SHAPE, repeats=REPEATS) -> int:
    """Prints the table; returns 0 when every variant matches its reference exactly."""
    caps = get_device().caps
    device = caps.name.split(" (")[0][:24]  # "llvmpipe (LLVM 15.0.6, 256 bits)" -> "llvmpipe"
    header = f"{'op':<50} {'variant':<52} {'device':<24} {'max error':>9} {'us/call':>9} {'GPU us':>8}"
    print(f"device {caps.name} (family {caps.family}); shape {tuple(shape)}, {repeats} calls per "
          "variant; max error in steps for integer outputs")
    print(header)
    print("-" * len(header))
    failures = 0
    gen = torch.Generator().manual_seed(0)
    for name in list_ops():
        op = get_op(name)
        build = EXAMPLES.get(name)
        # A dispatcher op (no steps of its own) runs once, along the route it picks.
        infos = op.variants if op.opdef.steps != () else [None]
        for info in infos:
            label = info.name if info else "(routed by the op)"
            runnable, reason = info.runnable(caps) if info else (True, "")
            if build is None or not runnable:
                why = reason if not runnable else "no example arguments"
                print(f"{name:<50} {label:<52} {device:<24} skipped: {why}")
                continue
            args, kwargs = build(info.axes if info else {}, shape, gen)
            host = [a.to_torch() if isinstance(a, Tensor) else a for a in args]
            want = op.reference(*host, **kwargs)
            variant = info.name if info else None
            walls = []
            for _ in range(repeats):
                start = time.perf_counter()
                got = op(*args, **kwargs, variant=variant)
                walls.append(time.perf_counter() - start)
            error = max_error(got, want)
            failures += error > tolerance(name, want)
            gpu = _gpu_seconds(op, args, kwargs, variant)
            gpu_text = f"{gpu * 1e6:8.1f}" if gpu is not None else "       -"
            print(
                f"{name:<50} {label:<52} {device:<24} {error:>9.3g} "
                f"{statistics.median(walls) * 1e6:>9.1f} {gpu_text}",
                flush=True,
            )
    print(f"{'all variants match their references' if not failures else f'{failures} variants differ from their references'}"
          " (within each op's tolerance: exact, one step for the convs, 1e-5 relative for linear)")
    return 1 if failures else 0
