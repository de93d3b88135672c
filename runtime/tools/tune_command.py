"""``python -m runtime tune FILE [--batch N] [--repeat R] [--no-program-check]``: tune every
conv of a saved program.

Reads the program (no loading on the device), collects the geometry of each
int8 conv node (with ``--batch``, N replaced, so one saved batch-1 program
tunes for batch 32) and the packed layout its input gets when the program
loads by the rules (a conv's input shares its layout with the class of
tensors around it: runtime/families/conv2d_layouts.py), tunes each distinct
geometry once (runtime/tools/tuner.py) in those layouts only, so that each
conv is timed as the program runs it and the choices keep the classes'
layouts, with one progress line per geometry on stderr, stores the measured
choices in this device's tuning cache (runtime/ops/tuning.py), then prints a
table on stdout: per layer the shape, the rule's choice and its time, the
tuned choice and its time, the speedup; and the totals.

Each conv is still timed alone, and a choice that wins alone can lose in the
program (a cache the next conv no longer finds warm). So the command then
times the whole program, loaded by the rules and loaded with the measured
choices, alternating, and keeps the choices only if the program with them is
faster; otherwise it puts back what the cache held for those geometries
before (nothing: the rules). The verdict
is the last line on stdout. ``--no-program-check`` keeps the choices
unchecked; with ``--batch`` other than the program's there is no program of
that batch to run, and the check is skipped (said on that line).

A later ``run`` or ``inspect`` of the program on this device uses the stored
choices. Errors are raised as `CommandError`s for the CLI to print as one
line. Called by runtime.tools.cli.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from runtime.families.conv2d_layouts import CONV_OPS
from runtime.ops import tuning
from runtime.ops.stub_support import coop_gemm_kernels
from runtime.programs.layouts import conv_geometry, resolve_layouts
from runtime.programs.loader import load
from runtime.programs.program import Program
from runtime.tools import tuner
from runtime.tools.program_commands import CommandError, program_inputs, progress, table
from runtime.vulkan.device import get_device


def _us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def _summary(result: tuner.ShapeResult) -> str:
    """The progress line's part about one tuned geometry."""
    rule, tuned = result.rule, result.tuned
    text = (f"rule {rule.label + ' ' + _us(rule.seconds) + ' us' if rule else 'cannot run here'}, "
            f"tuned {tuned.label} {_us(tuned.seconds)} us ({result.candidates} candidates")
    if result.failed:
        text += f"; {len(result.failed)} cannot run here, e.g. {result.failed[0]}"
    return text + ")"


# Whole-program runs of the program check: this many per `--repeat`, each load in turn.
PROGRAM_RUNS_PER_REPEAT = 5


def program_seconds(path: Path, repeat: int) -> tuple[float, float]:
    """Median seconds of a resident call (inputs on the device) of the program at `path`, loaded
    by the rules and loaded with the measured choices: one warm-up call each, then
    `PROGRAM_RUNS_PER_REPEAT` * `repeat` runs of each, in turn."""
    with tuning.rules_only():
        by_rule = load(path)
    measured = load(path)
    inputs = program_inputs(measured.program, None, seed=0)
    times: list[list[float]] = [[], []]  # by the rules, measured
    for loaded in (by_rule, measured):
        loaded(*inputs)  # the inputs the resident runs reuse; pipelines warmed
    for _ in range(PROGRAM_RUNS_PER_REPEAT * repeat):
        for seconds, loaded in zip(times, (by_rule, measured), strict=True):
            start = time.perf_counter()
            loaded.run_resident()
            seconds.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _program_check(path: Path, program_batch: int, batch: int | None, repeat: int,
                   cache: tuning.TuningCache, device: str, before: dict[str, dict]) -> str:
    """Times the program by the rules and with the choices just stored; puts back `before` (the
    entries of `cache` for `device` of those geometry keys before tuning) unless the program
    got faster. Returns the verdict line."""
    if batch is not None and batch != program_batch:
        return (f"program check: skipped (tuned for batch {batch}; the program runs batch "
                f"{program_batch}): the measured choices are kept unchecked")
    if not tuning.enabled():
        return f"program check: skipped ({tuning.SWITCH}=off: the program would run by the rules either way)"
    progress("timing the whole program by the rules and with the measured choices")
    by_rule, measured = program_seconds(path, repeat)
    line = (f"program check: {by_rule * 1e3:.3f} ms a call by the rules, {measured * 1e3:.3f} ms "
            f"with the measured choices (resident, median of {PROGRAM_RUNS_PER_REPEAT * repeat} "
            "runs each, in turn): ")
    if measured < by_rule:
        return line + "kept"
    for key, choices in before.items():
        cache.store(device, key, choices)
    return line + ("not faster, so the choices measured now are taken back: each geometry's cache "
                   "entry is as it was before (--no-program-check keeps them)")


def tune(path: Path, batch: int | None, repeat: int, program_check: bool = True) -> int:
    """Tunes the conv geometries of the program at `path`; returns the exit status."""
    if batch is not None and batch < 1:
        raise CommandError(f"--batch must be >= 1, got {batch}")
    if repeat < 1:
        raise CommandError(f"--repeat must be >= 1, got {repeat}")
    program = Program.load(path)
    caps = get_device().caps
    by_rule = resolve_layouts(program, caps.family, None, coop_gemm_kernels(caps))
    layers = []
    layouts: dict = {}  # geometry -> the layouts its convs' inputs get, in program order
    program_batch = None
    for node in program.nodes:
        if node.target in CONV_OPS:
            p = conv_geometry(program, node)
            program_batch = p.N
            p = dataclasses.replace(p, N=batch) if batch else p
            layers.append((node.name, p))
            layouts.setdefault(p, {})[by_rule.values[node.args[0].name].layout] = None
    if not layers:
        print(f"{path}: no int8 conv to tune")
        return 0
    if not tuning.enabled():
        progress(f"note: {tuning.SWITCH}=off: the choices are stored, but ignored while it is set")
    if get_device().validation:
        progress("note: the validation layer is on (ETVK_VALIDATION=1): it slows every dispatch")
    shapes = list(dict.fromkeys(p for _, p in layers))
    cache, device = tuning.tuning_cache(), tuning.device_key(caps)
    before = {tuning.shape_key(p): cache.choices(device, tuning.shape_key(p)) for p in shapes}
    timing = tuner.Timing(repeats=repeat)
    started = time.perf_counter()
    results = {}
    for i, p in enumerate(shapes, 1):
        begun = time.perf_counter()
        result = results[p] = tuner.tune_shape(p, timing, tuple(layouts[p]))
        tuner.store(result)
        progress(f"[{i}/{len(shapes)}] {tuning.shape_key(p)}: {_summary(result)} "
                 f"in {time.perf_counter() - begun:.1f} s")
    rows = [["layer", "shape", "rule", "us", "tuned", "us", "speedup"]]
    rule_total = tuned_total = 0.0
    for name, p in layers:
        rule, tuned = results[p].rule, results[p].tuned
        tuned_total += tuned.seconds
        if rule is None:
            rule_total = None
            rows.append([name, tuning.shape_key(p), "(cannot run here)", "n/a", tuned.label,
                         _us(tuned.seconds), "n/a"])
            continue
        if rule_total is not None:
            rule_total += rule.seconds
        rows.append([name, tuning.shape_key(p), rule.label, _us(rule.seconds), tuned.label,
                     _us(tuned.seconds), f"{rule.seconds / tuned.seconds:.2f}x"])
    speedup = "n/a" if rule_total is None else f"{rule_total / tuned_total:.2f}x"
    rows.append(["total", f"{len(layers)} convs, {len(shapes)} shapes", "", _us(rule_total), "",
                 _us(tuned_total), speedup])
    print(f"{path} on {caps.name} (family {caps.family}): GPU us per call by timestamps (rule "
          f"and tuned timed again side by side, median of {2 * repeat} replays after warm-up); "
          f"tuned in {time.perf_counter() - started:.1f} s, stored in {tuning.cache_path()}")
    print(table(rows))
    if program_check:
        print(_program_check(path, program_batch, batch, repeat, cache, device, before))
    return 0
