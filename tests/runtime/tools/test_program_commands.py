"""``python -m runtime export | inspect | run`` and the demo (its program part, and every variant
forced on its example arguments, as `make demo` runs them)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from runtime.programs.program import Program
from runtime.tools import cli, program_commands
from runtime.tools.demo import run_program, run_variants
from runtime.vulkan.device import get_device

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def exported_file(tmp_path_factory):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    path = tmp_path_factory.mktemp("cli") / "resnet18.etvk"
    assert cli.main(["export", "resnet18", "--size", "32", "--calibration", "2", "--out", str(path)]) == 0
    return path


def test_export_writes_a_program(exported_file, capsys):
    program = Program.load(exported_file)
    assert program.values[program.inputs[0]].shape == (1, 3, 32, 32)
    assert sum(n.target == "etvk.q8ta_conv2d.default" for n in program.nodes) == 20


def test_node_counts_tell_reshapes_from_other_pytorch_ops():
    """The export summary counts a flatten (a view on the device) apart from ops left to PyTorch."""
    nodes = [SimpleNamespace(is_etvk=True, target="etvk.q8ta_conv2d.default"),
             SimpleNamespace(is_etvk=False, target="aten.flatten.using_ints"),
             SimpleNamespace(is_etvk=False, target="aten._softmax.default")]
    assert program_commands.node_counts(SimpleNamespace(nodes=nodes)) == \
        "3 nodes, 1 etvk ops, 1 reshapes, 1 other PyTorch ops"


def test_inspect_shows_every_node_and_the_memory_plan(exported_file, capsys):
    assert cli.main(["inspect", str(exported_file)]) == 0
    out = capsys.readouterr().out
    program = Program.load(exported_file)
    lines = out.splitlines()
    assert lines[0].startswith(f"{exported_file}: {len(program.nodes)} nodes")
    assert "the same as this runtime's" in lines[0]
    assert lines[0].endswith(f", torch {torch.__version__}, torchao {version('torchao')}")  # what made the graph
    assert lines[1].split() == ["node", "target", "runs", "on", "op", "variant", "layout", "tuning", "reason"]
    assert all(any(line.startswith(n.name + " ") for line in lines) for n in program.nodes)
    # ResNet-18 is int8 from its first quantize to its last dequantize: every node on the device
    assert lines[0].startswith(f"{exported_file}: {len(program.nodes)} nodes, {len(program.nodes)} on ")
    # its residual adds run in the epilogues of convs
    assert "q8ta_max_pool2d" in out and "q8ta_linear" in out and "q8ta_add" not in out
    assert lines[-1].startswith("memory: ") and "planned into" in lines[-1]


def test_run_random_and_given_inputs(exported_file, tmp_path, capsys):
    assert cli.main(["run", str(exported_file), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "output bit-exact against PyTorch on the CPU" in out and "ms on the device" in out
    assert "convs on the device: 0 of 20 with measured choices" in out  # ETVK_TUNING=off
    assert ("validation layer: 0 error(s)" in out) == get_device().validation
    inputs = tmp_path / "inputs.safetensors"
    save_file({"x": torch.randn(1, 3, 32, 32)}, str(inputs))
    assert cli.main(["run", str(exported_file), "--inputs", str(inputs), "--repeat", "1"]) == 0
    save_file({"image": torch.randn(1, 3, 32, 32)}, str(inputs))
    assert cli.main(["run", str(exported_file), "--inputs", str(inputs)]) == 1
    assert "no tensor named 'x'; the program's inputs are x" in capsys.readouterr().err


def test_run_fails_on_validation_errors(capsys):
    class Device:
        validation = True

        def take_validation_messages(self, min_severity):
            assert min_severity == "error"
            return ["VUID-x: a missing barrier"]

    assert not program_commands._validation_clean(Device())
    assert capsys.readouterr().out.splitlines() == ["validation error: VUID-x: a missing barrier",
                                                    "validation layer: 1 error(s)"]


@pytest.mark.parametrize("args, message", [
    (["export", "resnet7", "--out", "x.etvk"], "unknown model 'resnet7'; known: alexnet, densenet121"),
    (["inspect", "missing.etvk"], "missing.etvk: cannot read it"),
    (["run", "missing.etvk"], "missing.etvk: cannot read it"),
])
def test_mistakes_print_one_line(args, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "runtime", *args], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                         "HOME": str(tmp_path)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_demo_program_part(capsys):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    assert run_program() == 0
    out = capsys.readouterr().out
    assert "device run vs CPU reference run: bit-exact" in out and "runs on" in out


def test_demo_variants_part(capsys):
    """Every variant this device runs is forced on its op's example arguments and matches the
    reference (a variant its example cannot serve raises, as a new axis once did)."""
    assert run_variants(repeats=1) == 0
    out = capsys.readouterr().out
    assert "all variants match their references" in out
    assert "cache_attention_tiled_float_none" in out and "cache_attention_tiled_float_shuffle" in out
