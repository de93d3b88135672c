"""``python -m runtime tune``, and a loaded program following measured conv choices."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from program_cases import random_batches

import runtime
from runtime.errors import UnsupportedVariant
from runtime.families.conv2d_layouts import CONV_OPS
from runtime.families.conv2d_tuning import Conv2dChoice
from runtime.ops import tuning
from runtime.ops.stub_support import coop_gemm_kernels
from runtime.programs.layouts import conv_geometry, resolve_layouts
from runtime.programs.program import Program
from runtime.tools import cli, tune_command, tuner
from runtime.vulkan.device import get_device


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache directory with measured choices switched on."""
    monkeypatch.setenv("ETVK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ETVK_TUNING", "on")
    return tuning.tuning_cache()


def conv_shapes(path, batch=None):
    program = Program.load(path)
    shapes = [conv_geometry(program, n) for n in program.nodes if n.target in CONV_OPS]
    return [dataclasses.replace(p, N=batch) if batch else p for p in shapes]


def test_tune_prints_a_table_and_loads_follow_it(small_cnn_file, cache, capsys):
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "1", "--no-program-check"]) == 0
    out, err = capsys.readouterr()
    shapes = conv_shapes(small_cnn_file)
    distinct = list(dict.fromkeys(shapes))
    progress = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert [line.split(":")[0] for line in progress] == [
        f"[{i}/{len(distinct)}] {tuning.shape_key(p)}" for i, p in enumerate(distinct, 1)]
    lines = out.splitlines()
    assert lines[0].startswith(f"{small_cnn_file} on {get_device().caps.name}")
    assert lines[1].split()[:3] == ["layer", "shape", "rule"] and lines[1].split()[-1] == "speedup"
    assert len(lines) == 2 + len(shapes) + 1 and lines[-1].startswith("total ")
    assert all(line.rstrip().endswith("x") for line in lines[2:])
    winners = {p: tuning.lookup(p) for p in distinct}
    assert None not in winners.values()
    assert all(winners[p].label in line for p, line in zip(shapes, lines[2:], strict=False))
    loaded = runtime.load(small_cnn_file)
    convs = [r for r in loaded.placement() if r["target"] in CONV_OPS]
    for row, p in zip(convs, shapes, strict=True):
        assert row["op"] == f"etvk.q8ta_conv2d_{winners[p].algorithm}.default"
        assert row["tuning"] == f"measured: {tuning.lookup(p, winners[p].algorithm).label}"
    for (x,) in random_batches(2, seed=3):
        assert torch.equal(loaded(x), loaded.program.run_reference(x))
    assert cli.main(["run", str(small_cnn_file), "--repeat", "1"]) == 0
    assert f"convs on the device: {len(shapes)} of {len(shapes)} with measured choices" in capsys.readouterr().out


def test_tune_retargets_the_batch(small_cnn_file, cache, capsys):
    assert cli.main(["tune", str(small_cnn_file), "--batch", "2", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "n2 c" in out
    batch = conv_shapes(small_cnn_file)[0].N
    assert out.splitlines()[-1] == (f"program check: skipped (tuned for batch 2; the program runs batch "
                                    f"{batch}): the measured choices are kept unchecked")
    assert all(tuning.lookup(p) is not None for p in conv_shapes(small_cnn_file, batch=2))
    assert all(tuning.lookup(p) is None for p in conv_shapes(small_cnn_file))


def _time_program(by_rule: float, measured: float, calls: list):
    """A stand-in for tune_command.program_seconds that answers fixed seconds."""
    def fake(path, repeat):
        calls.append((path, repeat))
        return by_rule, measured
    return fake


def test_the_program_check_keeps_choices_that_make_the_program_faster(small_cnn_file, cache, capsys,
                                                                      monkeypatch):
    calls = []
    monkeypatch.setattr(tune_command, "program_seconds", _time_program(2e-3, 1e-3, calls))
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "2"]) == 0
    assert calls == [(small_cnn_file, 2)]
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == ("program check: 2.000 ms a call by the rules, 1.000 ms with the measured choices "
                    "(resident, median of 10 runs each, in turn): kept")
    assert all(tuning.lookup(p) is not None for p in conv_shapes(small_cnn_file))


def test_the_program_check_takes_back_choices_that_do_not_pay(small_cnn_file, cache, capsys, monkeypatch):
    """Not faster as a program: each geometry's entry goes back to what it was before tuning
    (one planted choice stays, the others are removed), so loads follow the rules again."""
    device = tuning.device_key(get_device().caps)
    shapes = list(dict.fromkeys(conv_shapes(small_cnn_file)))
    planted = {"general": Conv2dChoice("general", "4C1W", (("out_w", 8),), 5e-6)}
    cache.store(device, tuning.shape_key(shapes[0]), planted)
    monkeypatch.setattr(tune_command, "program_seconds", _time_program(1e-3, 1e-3, []))
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "1"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.endswith("not faster, so the choices measured now are taken back: each geometry's cache "
                         "entry is as it was before (--no-program-check keeps them)")
    assert tuning.measured(shapes[0]) == planted
    assert all(tuning.lookup(p) is None for p in shapes[1:])
    assert all(cache.choices(device, tuning.shape_key(p)) == {} for p in shapes[1:])


def test_no_program_check_keeps_the_choices_untimed(small_cnn_file, cache, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(tune_command, "program_seconds", _time_program(1e-3, 2e-3, calls))
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "1", "--no-program-check"]) == 0
    assert calls == [] and "program check" not in capsys.readouterr().out
    assert all(tuning.lookup(p) is not None for p in conv_shapes(small_cnn_file))


def test_program_seconds_times_the_rules_against_the_measured_choices(small_cnn_file, cache, monkeypatch):
    """The two loads it times differ as they should: by the rules within rules_only, the measured
    choices outside it."""
    device = tuning.device_key(get_device().caps)
    for p in conv_shapes(small_cnn_file):
        cache.store(device, tuning.shape_key(p), {"general": Conv2dChoice("general", "4W4C", (("out_w", 8),), 1e-6)})
    loads = []
    real_load = tune_command.load

    def recording_load(path):
        loaded = real_load(path)
        loads.append({r["tuning"] for r in loaded.placement() if r["target"] in CONV_OPS})
        return loaded

    monkeypatch.setattr(tune_command, "load", recording_load)
    by_rule, measured = tune_command.program_seconds(small_cnn_file, 1)
    assert by_rule > 0 and measured > 0
    assert loads == [{"rule"}, {"measured: general 4W4C w8"}]


def test_tune_times_each_conv_in_the_layout_the_program_gives_it(small_cnn_file, cache, capsys):
    """Each geometry is measured with x in the layout its conv's input gets when the program loads
    by the rules (its class's), and only there: every stored choice reads that layout, the rule's
    row too, and the program loaded with the choices keeps every class's layout."""
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "1", "--no-program-check"]) == 0
    table_rows = capsys.readouterr().out.splitlines()[2:-1]
    caps = get_device().caps
    program = Program.load(small_cnn_file)
    by_rule = resolve_layouts(program, caps.family, None, coop_gemm_kernels(caps))
    convs = [n for n in program.nodes if n.target in CONV_OPS]
    device = tuning.device_key(caps)
    for node, row in zip(convs, table_rows, strict=True):
        layout = by_rule.values[node.args[0].name].layout
        stored = cache.choices(device, tuning.shape_key(conv_geometry(program, node)))
        assert stored and {c.layout for c in stored.values()} == {layout}, (node.name, stored)
        assert row.count(f" {layout} ") == 2, row  # the rule's and the tuned choice's labels
    loaded = runtime.load(small_cnn_file)
    assert [loaded.program.values[n.args[0].name].layout for n in convs] == \
        [by_rule.values[n.args[0].name].layout for n in convs]


def test_a_planted_choice_sets_layouts_and_algorithms(small_cnn_file, cache):
    device = tuning.device_key(get_device().caps)
    for p in conv_shapes(small_cnn_file):
        cache.store(device, tuning.shape_key(p), {"general": Conv2dChoice("general", "4W4C", (("out_w", 8),), 1e-6)})
    loaded = runtime.load(small_cnn_file)
    convs = [r for r in loaded.placement() if r["target"] in CONV_OPS]
    assert {(r["op"], r["layout"], r["tuning"]) for r in convs} == {
        ("etvk.q8ta_conv2d_general.default", "4W4C", "measured: general 4W4C w8")}
    (x,) = random_batches(1, seed=4)[0]
    assert torch.equal(loaded(x), loaded.program.run_reference(x))


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "missing.etvk"], "missing.etvk: cannot read it"),
    (["tune", "{file}", "--batch", "0"], "--batch must be >= 1, got 0"),
    (["tune", "{file}", "--repeat", "0"], "--repeat must be >= 1, got 0"),
])
def test_tune_bad_arguments_print_one_line(small_cnn_file, cache, capsys, argv, message):
    assert cli.main([a.format(file=small_cnn_file) for a in argv]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err


def test_candidates_that_cannot_run_are_skipped(small_cnn_file, cache, capsys, monkeypatch):
    def fake_time(choice, p, x, args, repeats, warmup):
        if choice.algorithm in ("im2col", "im2col_coop", "pw_coop") or choice.layout == "4W4C":
            raise UnsupportedVariant(f"this test's device lacks {choice.label}")
        return 1e-6 * (1 + dict(choice.settings).get("out_w", 0))

    monkeypatch.setattr(tuner, "time_choice", fake_time)
    assert cli.main(["tune", str(small_cnn_file), "--repeat", "1"]) == 0
    out, err = capsys.readouterr()
    assert "cannot run here, e.g. im2col" in err or "cannot run here, e.g. general 4W4C" in err
    assert "(cannot run here)" in out  # the rule's im2col on the 16-channel convs
    for p in conv_shapes(small_cnn_file):
        assert tuning.measured(p) == {"general": Conv2dChoice("general", "4C", (), 1e-6)}
