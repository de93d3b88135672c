"""The int8 conv tuner: times the ways to run one conv geometry on this device, keeps the fastest.

For a geometry it times, with GPU timestamps, every algorithm whose op
accepts it (runtime/families/conv2d_tuning.py) in two rounds:

1. every algorithm x every packed input layout asked for (all of 4W4C, 4C,
   4C1W for a geometry alone; the layouts its convs get in a program for
   ``tune``), each with its rule settings (the GEMM tiling rule, OUT_W 4);
2. every algorithm at its fastest layout with each of its candidate
   settings (the GEMM tilings, or the OUT_W values); a tiling over the
   device's shared memory is refused when its pipeline is built, and listed
   among the candidates that cannot run.

Each candidate runs through its algorithm op under `tuning.forcing`, so it
is exactly what a program with that choice cached would record. A stream of
up to 4 back-to-back calls is replayed for a short warm-up (10 ms; 0.2 s
before a geometry's first candidate, since an idle GPU drops its clock:
benchmarks/NOTES.md), then `repeats` times; a candidate's time is the median
call (the sum of its dispatches' timestamps). Then the rule's choice (OPS.md,
for this GPU family, moved to the cooperative-matrix GEMM where the dispatcher
moves it: what runs with nothing measured, in its algorithm's layout, or in the
first layout asked for where that one is not among them) and the fastest choice are timed
again side by side for the report; `store` writes each algorithm's fastest
choice to the tuning cache.

Called by the ``tune`` command (tune_command.py) and the tests; inputs are
random (timing does not depend on values).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.errors import EtvkError, TensorTooLarge, UnsupportedVariant
from runtime.families.conv2d import Conv2dParams
from runtime.families.conv2d_layouts import ALGORITHM_INPUT_LAYOUT
from runtime.families.conv2d_tuning import Conv2dChoice, candidate_algorithms, candidate_settings
from runtime.ops import tuning
from runtime.ops.registry import get_op
from runtime.ops.stub_support import rule_algorithm
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs
from runtime.vulkan.device import get_device
from runtime.vulkan.layouts import PACKED_LAYOUTS
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

ALGORITHM_OPS = {
    "pw": "etvk.q8ta_conv2d_pw.default",
    "dw": "etvk.q8ta_conv2d_dw.default",
    "im2col": "etvk.q8ta_conv2d_im2col.default",
    "general": "etvk.q8ta_conv2d_general.default",
    "pw_coop": "etvk.q8ta_conv2d_pw_coop.default",
    "im2col_coop": "etvk.q8ta_conv2d_im2col_coop.default",
}
STREAM_BYTES = 256 << 20  # outputs + im2col scratch of one recorded stream, at most
MAX_CALLS = 4  # back-to-back calls per recorded stream


class TuningError(EtvkError, RuntimeError):
    """The device cannot be tuned (no timestamp queries)."""


@dataclass(frozen=True)
class Timing:
    """How long to time each candidate: `repeats` replays after `warmup` seconds of replays
    (`shape_warmup` for a geometry's first candidate, after the host prepared its inputs)."""

    repeats: int = 3
    warmup: float = 0.01
    shape_warmup: float = 0.2


@dataclass(frozen=True)
class ShapeResult:
    """What tuning one geometry found.

    Attributes:
        params: the geometry.
        rule: the rule's choice (None if it cannot run here) and `tuned`, the
            fastest choice of all, each timed again side by side after the
            search (so the speedup is not the search's luckiest sample).
        best: each algorithm's fastest choice, as the search timed it (what
            the cache keeps).
        candidates: how many were timed.
        failed: "<label>: <why>" of each candidate that cannot run here.
    """

    params: Conv2dParams
    rule: Conv2dChoice | None
    tuned: Conv2dChoice
    best: dict[str, Conv2dChoice]
    candidates: int
    failed: tuple[str, ...] = ()


def conv_inputs(p: Conv2dParams, seed: int = 0) -> tuple:
    """Random ``etvk.q8ta_conv2d`` arguments (schema order, relu) for the geometry `p`."""
    case = Conv2dCase("tuning", p.N, p.C_in, p.H, p.W, p.C_out, (p.KH, p.KW), p.stride, p.padding,
                      p.dilation, p.groups, activation="relu")
    return make_inputs(case, seed).args()


def with_device_input(args: tuple, layout: str) -> tuple:
    """`args` with x uploaded in the packed `layout`."""
    return (Tensor.from_torch(args[0], layout=layout, label=f"tuning x ({layout})"), *args[1:])


def run_choice(choice: Conv2dChoice, args: tuple):
    """Runs the conv once as `choice` says (x uploaded in its layout); returns the int8 output."""
    with tuning.forcing(choice):
        return get_op(ALGORITHM_OPS[choice.algorithm])(*with_device_input(args, choice.layout))


def _call_bytes(p: Conv2dParams, algorithm: str) -> int:
    out = p.N * p.C_out * p.H_out * p.W_out
    return out + (p.N * p.groups * p.gemm_k * p.H_out * p.W_out if algorithm == "im2col" else 0)


def time_choice(choice: Conv2dChoice, p: Conv2dParams, x: Tensor, args: tuple, repeats: int,
                warmup: float) -> float:
    """Median GPU seconds of one call of the conv run as `choice` (x already in its layout),
    over `repeats` replays after `warmup` seconds of replays.

    Raises:
        TuningError: the device has no timestamp queries.
    """
    calls = max(1, min(MAX_CALLS, STREAM_BYTES // max(1, _call_bytes(p, choice.algorithm))))
    op = get_op(ALGORITHM_OPS[choice.algorithm])
    with Stream() as stream:
        with tuning.forcing(choice):
            for _ in range(calls):
                op.record(stream, x, *args[1:])
        stream.run()
        if not stream.timings():
            raise TuningError(f"{get_device().caps.name} has no timestamp queries: nothing to time")
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            stream.replay()
        per_call = []
        for _ in range(repeats):
            stream.replay()
            seconds = [t for _, t in stream.timings()]
            step = len(seconds) // calls
            per_call += [math.fsum(seconds[i * step:(i + 1) * step]) for i in range(calls)]
    return statistics.median(per_call)


def tune_shape(p: Conv2dParams, timing: Timing = Timing(),
               layouts: Sequence[str] = PACKED_LAYOUTS) -> ShapeResult:
    """Times the candidates of geometry `p` (module docstring) with x in each of `layouts` and
    returns what it found.

    A candidate this device cannot run (a variant it lacks, a tensor over its limits) is
    skipped and listed in the result.

    Raises:
        TuningError: no timestamp queries, or no candidate runs.
    """
    caps = get_device().caps
    args = conv_inputs(p)
    if not layouts or set(layouts) - set(PACKED_LAYOUTS):
        raise ValueError(f"layouts must be some of {PACKED_LAYOUTS}, got {layouts}")
    inputs = {layout: with_device_input(args, layout)[0] for layout in layouts}
    timed: list[Conv2dChoice] = []
    failed: list[str] = []

    def measure(choices) -> list[Conv2dChoice]:
        done = []
        for choice in choices:
            warmup = timing.warmup if timed else timing.shape_warmup
            try:
                seconds = time_choice(choice, p, inputs[choice.layout], args, timing.repeats, warmup)
            except (UnsupportedVariant, TensorTooLarge) as exc:
                failed.append(f"{choice.label}: {exc}")
                continue
            timed.append(Conv2dChoice(choice.algorithm, choice.layout, choice.settings, seconds))
            done.append(timed[-1])
        return done

    best: dict[str, Conv2dChoice] = {}
    for algorithm in candidate_algorithms(p):
        first = measure(Conv2dChoice(algorithm, layout) for layout in layouts)
        if not first:
            continue
        layout = min(first, key=lambda c: c.seconds).layout
        tried = measure(Conv2dChoice(algorithm, layout, s) for s in candidate_settings(algorithm))
        best[algorithm] = min(first + tried, key=lambda c: c.seconds)
    if not best:
        raise TuningError(f"{tuning.shape_key(p)}: no candidate runs on {caps.name}: {failed[0]}")
    route = rule_algorithm(p)  # the dispatcher's, the coop GEMM included where it moves there
    rule_layout = ALGORITHM_INPUT_LAYOUT[route.removesuffix("_coop")]
    if rule_layout not in layouts:  # where the program puts the conv
        rule_layout = layouts[0]
    rule = next((c for c in timed if c.algorithm == route and not c.settings
                 and c.layout == rule_layout), None)
    tuned = min(best.values(), key=lambda c: c.seconds)
    if rule is not None and tuned != rule:
        rule, tuned = (dataclasses.replace(c, seconds=time_choice(
            c, p, inputs[c.layout], args, 2 * timing.repeats, timing.warmup)) for c in (rule, tuned))
    elif rule is not None:
        tuned = rule
    return ShapeResult(p, rule, tuned, best, len(timed), tuple(failed))


def store(result: ShapeResult) -> None:
    """Writes the best choice of each algorithm of `result` to the tuning cache of this device."""
    tuning.tuning_cache().store(tuning.device_key(get_device().caps), tuning.shape_key(result.params),
                                result.best)
