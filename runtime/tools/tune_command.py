"""``python -m runtime tune FILE [--batch N] [--repeat R]``: tune every conv of a saved program.

Reads the program (no loading on the device), collects the geometry of each
int8 conv node (with ``--batch``, N replaced, so one saved batch-1 program
tunes for batch 32), tunes each distinct geometry once (runtime/tools/tuner.py)
with one progress line per geometry on stderr, stores the measured choices
in this device's tuning cache (runtime/ops/tuning.py), then prints a table
on stdout: per layer the shape, the rule's choice and its time, the tuned
choice and its time, the speedup; and the totals. A later ``run`` or
``inspect`` of the program on this device uses the stored choices.
Errors are raised as `CommandError`s for the CLI to print as one line.
Called by runtime.tools.cli.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from runtime.families.conv2d_layouts import CONV_OPS
from runtime.ops import tuning
from runtime.programs.layouts import conv_geometry
from runtime.programs.program import Program
from runtime.tools import tuner
from runtime.tools.program_commands import CommandError, progress, table
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


def tune(path: Path, batch: int | None, repeat: int) -> int:
    """Tunes the conv geometries of the program at `path`; returns the exit status."""
    if batch is not None and batch < 1:
        raise CommandError(f"--batch must be >= 1, got {batch}")
    if repeat < 1:
        raise CommandError(f"--repeat must be >= 1, got {repeat}")
    program = Program.load(path)
    layers = []
    for node in program.nodes:
        if node.target in CONV_OPS:
            p = conv_geometry(program, node)
            layers.append((node.name, dataclasses.replace(p, N=batch) if batch else p))
    caps = get_device().caps
    if not layers:
        print(f"{path}: no int8 conv to tune")
        return 0
    if not tuning.enabled():
        progress(f"note: {tuning.SWITCH}=off: the choices are stored, but ignored while it is set")
    if get_device().validation:
        progress("note: the validation layer is on (ETVK_VALIDATION=1): it slows every dispatch")
    shapes = list(dict.fromkeys(p for _, p in layers))
    timing = tuner.Timing(repeats=repeat)
    started = time.perf_counter()
    results = {}
    for i, p in enumerate(shapes, 1):
        begun = time.perf_counter()
        result = results[p] = tuner.tune_shape(p, timing)
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
    return 0
