"""`python -m runtime stats`: the table, and one clean line for every mistake."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from runtime.tools import cli
from runtime.tools.program_commands import CommandError
from runtime.tools.statistics_command import parse_specs
from runtime.vulkan.device import get_device

VARIANT = "q8ta_gemm_fallback"  # no required capability; BLOCK_K sizes its shared memory


def test_parse_specs():
    assert parse_specs(["STEPS=4", "MASK=0x10", "SCALE=1.5", " PAD =2"]) == {
        "STEPS": 4, "MASK": 16, "SCALE": 1.5, "PAD": 2}


@pytest.mark.parametrize("item", ["STEPS", "=4", "STEPS=four", "STEPS="])
def test_parse_specs_refuses(item):
    with pytest.raises(CommandError, match=f"--spec '{item}': expected NAME=NUMBER"):
        parse_specs([item])


@pytest.mark.parametrize("argv, message", [
    (["stats", "nope"], "no shader variant 'nope' in "),
    (["stats", VARIANT, "--spec", "NOPE=1"], "--spec NOPE: no named variant has such a spec constant"),
    (["stats", VARIANT, "--spec", "BLOCK_K"], "--spec 'BLOCK_K': expected NAME=NUMBER, e.g. STEPS=4"),
])
def test_mistakes_print_one_line(argv, message, capsys):
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err


def test_a_device_that_cannot_report(monkeypatch, capsys):
    caps = get_device().caps
    without = SimpleNamespace(caps=dataclasses.replace(caps, pipeline_statistics=False))
    monkeypatch.setattr("runtime.tools.statistics_command.get_device", lambda: without)
    assert cli.main(["stats", VARIANT]) == 1
    assert capsys.readouterr().err == (f"device {caps.name} cannot report pipeline statistics: "
                                       "the driver lacks VK_KHR_pipeline_executable_properties\n")


def test_a_variant_the_device_cannot_run(monkeypatch, capsys):
    caps = get_device().caps
    reporting = SimpleNamespace(caps=dataclasses.replace(
        caps, pipeline_statistics=True, features=caps.features - {"integer_dot_product"}))
    monkeypatch.setattr("runtime.tools.statistics_command.get_device", lambda: reporting)
    assert cli.main(["stats", "q8ta_gemm_sdot"]) == 1
    assert capsys.readouterr().err == f"q8ta_gemm_sdot cannot run here: {caps.name} lacks integer_dot_product\n"


def test_table(capsys):
    device = get_device()
    if not device.caps.pipeline_statistics:
        pytest.skip(f"{device.caps.name} cannot report pipeline statistics")
    assert cli.main(["stats", VARIANT, "--spec", "BLOCK_K=16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["variant", "executable", "statistic", "value", "description"]
    assert len(lines) > 1 and {line.split()[0] for line in lines[1:]} == {VARIANT}
