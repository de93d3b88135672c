"""``python -m runtime demo``: every op's variants, then a quantized CNN, on the default device.

Runs each generated variant once on the example arguments of
`runtime.tools.examples`, compares with the op's PyTorch reference and prints one
row per variant as it finishes: op, variant, device, max error, wall-clock µs
per eager call (upload + dispatch + download) and GPU µs from timestamps.
Then a small CNN is quantized with PT2E, lowered, saved, loaded and run,
printing its placement and its agreement with the CPU reference run and with
PyTorch's own run. Called by runtime.tools.cli; it adds no behaviour of its
own to ops or programs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from runtime.ops.library import catalog
from runtime.ops.registry import get_op, list_ops
from runtime.programs.loader import load
from runtime.programs.lower import lower
from runtime.tools.examples import EXAMPLES, tolerance
from runtime.tools.models import ModelError, SmallCNN, quantize_pt2e
from runtime.vulkan.device import get_device
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

DEMO_SHAPE = (64, 1000)
PROGRAM_SHAPE = (1, 3, 16, 16)
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
    """Every variant, then a small CNN end to end; returns 0 when everything matches."""
    status = run_variants(shape, repeats)
    return run_program() or status


def _other_steps_gap(op, caps) -> str:
    """Why some step of a multi-step op has no variant that runs on `caps`, or ""."""
    for names in op.opdef.steps or ():
        verdicts = [catalog().variant(name).runnable(caps) for name in names]
        if not any(ok for ok, _ in verdicts):
            return "another step cannot run: " + "; ".join(why for _, why in verdicts)
    return ""


def run_variants(shape=DEMO_SHAPE, repeats=REPEATS) -> int:
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
            if runnable and info:
                reason = _other_steps_gap(op, caps)
                runnable = not reason
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
            failures += error > tolerance(name, want, host)
            gpu = _gpu_seconds(op, args, kwargs, variant)
            gpu_text = f"{gpu * 1e6:8.1f}" if gpu is not None else "       -"
            print(
                f"{name:<50} {label:<52} {device:<24} {error:>9.3g} "
                f"{statistics.median(walls) * 1e6:>9.1f} {gpu_text}",
                flush=True,
            )
    print(f"{'all variants match their references' if not failures else f'{failures} variants differ from their references'}"
          " (bit-exact; linear_qta8a_qga4w within 1e-5 relative, rms_norm, layer_norm and act_mul within"
          " docs/llm_ops.md's tolerances, cache_attention within docs/attention_ops.md's)")
    return 1 if failures else 0


def run_program() -> int:
    """A small quantized CNN exported, saved, loaded on the default device and run.

    Prints its placement and its agreement with the CPU reference run (which
    must be bit-exact) and with PyTorch's own run of the quantized model.
    Returns 0 when the device run is bit-exact; without torchao it says so
    and returns 0.
    """
    print("\n== a quantized CNN: export -> save -> load -> run ==")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randn(PROGRAM_SHAPE, generator=gen),) for _ in range(5)]
    try:
        exported = quantize_pt2e(SmallCNN(), batches[0], batches[1:])
    except ModelError as exc:
        print(f"skipped: {exc}")
        return 0
    with tempfile.TemporaryDirectory(prefix="etvk-demo-") as folder:
        path = Path(folder) / "small_cnn.etvk"
        lower(exported).save(path)
        print(f"SmallCNN, PT2E int8, input {list(PROGRAM_SHAPE)} -> {path.name} "
              f"({path.stat().st_size / 1024:.0f} KiB)")
        loaded = load(path)
    print(f"{'node':<26} {'runs on':<8} {'op':<44} {'layout':<6} variant / reason")
    for row in loaded.placement():
        what = row["variant"] if row["runs_on"] == "vulkan" else row["reason"]
        op = row["op"].removeprefix("etvk.").removesuffix(".default")
        print(f"{row['node']:<26} {row['runs_on']:<8} {op:<44} {row['layout'] or '':<6} {what}")
    (x,) = batches[0]
    got, want, theirs = loaded(x), loaded.program.run_reference(x), exported.module()(x)
    exact = torch.equal(got, want)
    same = int((got == theirs).sum())
    print(f"device run vs CPU reference run: {'bit-exact' if exact else 'DIFFERENT'}; vs PyTorch's own "
          f"run of the quantized model: {same} of {got.numel()} outputs equal, max |difference| "
          f"{(got - theirs).abs().max().item():.3g}")
    return 0 if exact else 1
