"""Bad program files: every fault is one ProgramFileError naming the file and the fault."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from runtime.programs.fileformat import ProgramFileError
from runtime.programs.program import Program
from runtime.tools.program_commands import CommandError, save

REPO = Path(__file__).resolve().parents[3]


def _parts(path):
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())


def _rewrite(source, target, change_graph=None, change_metadata=None, change_tensors=None):
    """A copy of the file with its graph JSON, metadata or tensors changed (checksum kept valid)."""
    import hashlib

    tensors, metadata = _parts(source)
    if change_graph:
        graph = json.loads(metadata["etvk.program"])
        change_graph(graph)
        metadata["etvk.program"] = json.dumps(graph)
        metadata["etvk.program_sha256"] = hashlib.sha256(metadata["etvk.program"].encode()).hexdigest()
    if change_metadata:
        change_metadata(metadata)
    if change_tensors:
        change_tensors(tensors)
    save_file(tensors, str(target), metadata=metadata)
    return target


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _conv(graph):
    return next(n for n in graph["nodes"] if n["target"] == "etvk.q8ta_conv2d.default")


def _weight_name(graph):
    return _conv(graph)["args"][3]["const"]


CASES = {
    "empty": (lambda src, dst: _write(dst, b""), "the file is empty"),
    "garbage": (lambda src, dst: _write(dst, b"\x00" * 64), "not a program file, or truncated"),
    "truncated": (lambda src, dst: _write(dst, src.read_bytes()[:-100]),
                  "not a program file, or truncated or corrupted"),
    "not a program": (lambda src, dst: save_file({"a": torch.zeros(2)}, str(dst)) or dst,
                      "not an etvk program file"),
    "another format": (lambda src, dst: _rewrite(src, dst, change_metadata=lambda m: m.update(
        {"etvk.format": "999"})), "program format '999'; this runtime reads formats 2, 3"),
    "graph checksum": (lambda src, dst: _rewrite(src, dst, change_metadata=lambda m: m.update(
        {"etvk.program": m["etvk.program"].replace('"relu"', '"none"')})),
        "the program graph is corrupted (checksum mismatch)"),
    "graph not json": (lambda src, dst: _rewrite(src, dst, change_metadata=lambda m: m.update(
        {"etvk.program": "{", "etvk.program_sha256": __import__("hashlib").sha256(b"{").hexdigest()})),
        "the program graph is not valid JSON"),
    "unknown op": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g["nodes"][-1].update(
        target="aten.definitely_not_an_op.default")), "unknown op 'aten.definitely_not_an_op.default'"),
    "foreign namespace": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g["nodes"][-1].update(
        target="os.system.default")), "unknown op 'os.system.default'"),
    "changed schema": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g["ops"].update(
        {"etvk.q8ta_conv2d.default": "q8ta_conv2d(Tensor x) -> Tensor"})),
        "op etvk.q8ta_conv2d.default has changed: the file was written for"),
    "schema with an argument more": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g["ops"].update(
        {"etvk.q8ta_conv2d.default": g["ops"]["etvk.q8ta_conv2d.default"].replace(
            ") -> Tensor", ", int extra) -> Tensor")})), "op etvk.q8ta_conv2d.default has changed"),
    "missing constant": (lambda src, dst: _rewrite(src, dst, change_tensors=lambda t: t.pop(
        sorted(t)[0])), "missing constant"),
    "mis-shaped constant": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g["constants"][
        _weight_name(g)].update(shape=[1])), "is int8 of shape"),
    "corrupted constant": (lambda src, dst: _rewrite(src, dst, change_tensors=lambda t: t.update(
        {k: t[k].flip(0) for k in t if t[k].dtype == torch.int8 and t[k].dim() == 4})),
        "is corrupted (checksum mismatch)"),
    "unknown value": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: _conv(g)["args"].__setitem__(
        0, {"ref": "nowhere"})), "reads 'nowhere', which no earlier node or input defines"),
    "bad argument kind": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: _conv(g)["args"].__setitem__(
        1, {"code": "print(1)"})), "unknown argument kind 'code'"),
    "missing key": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g.pop("nodes")),
                    "the graph's 'nodes' is missing"),
    "bad library versions": (lambda src, dst: _rewrite(src, dst, change_graph=lambda g: g.update(
        lowered_with={"torch": 2.13})), "the graph's 'lowered_with' is not a mapping of library names"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_file(case, small_cnn_file, tmp_path):
    make, fault = CASES[case]
    path = make(small_cnn_file, tmp_path / "bad.etvk")
    with pytest.raises(ProgramFileError) as info:
        Program.load(path)
    assert str(info.value).startswith(f"{path}: ") and fault in str(info.value), str(info.value)
    assert isinstance(info.value, ValueError)


def _drop_last_argument(schema: str) -> str:
    head, _, returns = schema.rpartition(") -> ")
    return f"{head.rpartition(', ')[0]}) -> {returns}"


def test_a_file_from_before_an_optional_argument_loads(small_cnn_file, tmp_path):
    """A file written before an op gained a trailing argument with a default (the runtime's
    schema is the file's plus that argument) loads, and its nodes run with the default."""
    conv = "etvk.q8ta_conv2d.default"
    older = _drop_last_argument(Program.load(small_cnn_file).op_schemas[conv])
    path = _rewrite(small_cnn_file, tmp_path / "older.etvk", change_graph=lambda g: g["ops"].update(
        {conv: older}))
    loaded, current = Program.load(path), Program.load(small_cnn_file)
    assert loaded.op_schemas[conv] == older != current.op_schemas[conv]
    assert all(len(n.args) <= len(older.split(",")) for n in loaded.nodes if n.target == conv)
    x = torch.randn(*current.values[current.inputs[0]].shape)
    assert all(torch.equal(a, b) for a, b in zip(loaded.run_reference(x), current.run_reference(x), strict=True))


def test_a_file_says_which_torch_made_its_graph(small_cnn_file, tmp_path):
    """The versions of torch and torchao that lowered the graph are saved and read back (PT2E
    graphs differ between torch versions); a file from before, without them, loads with none."""
    from importlib.metadata import version

    assert Program.load(small_cnn_file).lowered_with == {"torch": torch.__version__, "torchao": version("torchao")}
    path = _rewrite(small_cnn_file, tmp_path / "older.etvk", change_graph=lambda g: g.pop("lowered_with"))
    assert Program.load(path).lowered_with == {}


def test_a_saved_file_has_the_umask_mode(small_cnn, tmp_path):
    """Like any file a program writes (safetensors alone would make it 0600, unreadable to others)."""
    old = os.umask(0o027)
    try:
        small_cnn[2].save(tmp_path / "m.etvk")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m.etvk").stat().st_mode) == 0o640


def test_missing_file(tmp_path):
    with pytest.raises(ProgramFileError, match="nope.etvk: cannot read it"):
        Program.load(tmp_path / "nope.etvk")


def test_the_cli_prints_one_line(small_cnn_file, tmp_path):
    bad = tmp_path / "bad.etvk"
    bad.write_bytes(small_cnn_file.read_bytes()[:1000])
    result = subprocess.run([sys.executable, "-m", "runtime", "inspect", str(bad)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith(f"{bad}: not a program file")


def test_saving_refuses_what_it_cannot_hold(small_cnn, tmp_path):
    program = small_cnn[2].copy()
    program.nodes[-1].args = (*program.nodes[-1].args[:-1], float("nan"))
    with pytest.raises(ValueError, match="non-finite float argument nan cannot be saved"):
        program.save(tmp_path / "x.etvk")
    assert not (tmp_path / "x.etvk").exists()


def test_saving_refuses_an_op_no_reader_runs(small_cnn, tmp_path):
    """An op outside the namespaces a reader resolves (transformers' own, say) is refused when
    the file would be written, naming the node, not when it is read back."""
    program = small_cnn[2].copy()
    program.nodes[-1].target = "transformers.grouped_mm_fallback.default"
    with pytest.raises(ValueError, match=rf"node {program.nodes[-1].name!r}: unknown op "
                                         r"'transformers.grouped_mm_fallback.default'.*could not be loaded"):
        program.save(tmp_path / "x.etvk")
    assert not (tmp_path / "x.etvk").exists()


def test_the_export_commands_name_the_file_a_program_cannot_be_saved_to(small_cnn, tmp_path):
    """The CLI's export commands save through `program_commands.save`: a program the format
    cannot hold is one `CommandError` (one line from the CLI), naming the file and the node."""
    program = small_cnn[2].copy()
    program.nodes[-1].target = "transformers.grouped_mm_fallback.default"
    out = tmp_path / "x.etvk"
    with pytest.raises(CommandError, match=rf"^{out}: the program cannot be saved: node {program.nodes[-1].name!r}"):
        save(program, out)
    assert not out.exists()
