"""The program file: one safetensors file, versioned, checked on read, never executed.

Layout: the constants are the file's tensors (safetensors: a length-prefixed
JSON header of names, dtypes, shapes and offsets, then raw bytes), and the
header's metadata holds

- ``etvk.format``: `FORMAT`, the version of this layout;
- ``etvk.program``: the program as JSON (inputs, outputs, values with shape,
  dtype and layout, nodes with their arguments, the ``etvk`` op schemas, the
  manifest hash, the versions of torch and torchao that made the graph (none
  in files from before), every constant's shape, dtype and sha256, the state: each
  state value's start (null for zeros: no bytes are stored for a zero KV
  cache, only its shape) and update, the checks on input values, and for
  a decoder with a dynamic token count its token dimensions and the graph
  of each further token count (``specializations``: the same fields but
  the constants, which they share);
- ``etvk.program_sha256``: the sha256 of that JSON.

Reading parses with the safetensors library (no pickle) and checks every
fault a damaged or foreign file can have; each becomes one
`ProgramFileError` naming the file and the fault: an empty, truncated or
non-safetensors file, another format version, a graph that fails its
checksum or does not parse, a malformed graph, a missing, extra, mis-shaped
or corrupted constant, a node reading an unknown value, an unknown op, an
``etvk`` op whose schema changed (other than by appended arguments with defaults, which
the file's nodes leave at their defaults: `schema_reads`), or state or checks that name
unknown values. Used by program.py.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

from runtime.errors import EtvkError
from runtime.ops.registry import get_op
from runtime.programs.cpu import UnknownOp, resolve_op
from runtime.programs.nodes import Const, InputCheck, Node, Ref, ValueSpec, walk_args

FORMAT = 3
_READS = ("2", "3")  # format 2: the same without token counts
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool)}
_TAGS = {  # tagged JSON objects for arguments that are not JSON scalars
    "dtype": (torch.dtype, lambda v: str(v).removeprefix("torch."), lambda s: _DTYPES[s]),
    "device": (torch.device, str, torch.device),
    "layout": (torch.layout, lambda v: str(v).removeprefix("torch."), lambda s: getattr(torch, s)),
    "memory_format": (torch.memory_format, lambda v: str(v).removeprefix("torch."),
                      lambda s: getattr(torch, s)),
}
_LAYOUT_NAMES = (torch.strided,)
_MEMORY_FORMATS = (torch.contiguous_format, torch.channels_last, torch.preserve_format)


class ProgramFileError(EtvkError, ValueError):
    """A program file that cannot be read: `str()` is ``"<file>: <fault>"``."""

    def __init__(self, path, fault: str):
        self.path, self.fault = str(path), fault
        super().__init__(f"{path}: {fault}")


def _sha256(tensor: torch.Tensor) -> str:
    """The sha256 of the tensor's bytes, read in place (no copy of a contiguous tensor)."""
    digest = hashlib.sha256()
    if tensor.numel():
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


# ---------------------------------------------------------------- writing


def _encode(value, where: str):
    if isinstance(value, Ref):
        return {"ref": value.name}
    if isinstance(value, Const):
        return {"const": value.name}
    if isinstance(value, (list, tuple)):
        return [_encode(v, where) for v in value]
    for tag, (kind, dump, _) in _TAGS.items():
        if isinstance(value, kind):
            return {tag: dump(value)}
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: non-finite float argument {value!r} cannot be saved")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"{where}: argument {value!r} ({type(value).__name__}) cannot be saved")


def _spec_json(spec: ValueSpec) -> dict:
    return {"shape": list(spec.shape), "dtype": str(spec.dtype).removeprefix("torch."),
            "layout": spec.layout}


def _op_fault(node: Node) -> str | None:
    """Why a reader cannot run `node`'s op (`resolve_op`), or None: the check of the writer
    (`_readable_target`) and of the reader (`_check_ops`)."""
    try:
        resolve_op(node.target)
    except UnknownOp as exc:
        return f"node {node.name!r}: {exc}"
    return None


def _readable_target(node: Node) -> str:
    """`node`'s target, one a reader runs.

    Raises:
        ValueError: another op (a file holding it could not be loaded).
    """
    fault = _op_fault(node)
    if fault is not None:
        raise ValueError(f"{fault}, so a file holding it could not be loaded")
    return node.target


def _graph_json(program) -> dict:
    """The fields of one graph of `program` (its constants apart)."""
    return {
        "inputs": list(program.inputs),
        "outputs": list(program.outputs),
        "output_tuple": program.output_tuple,
        "values": {name: _spec_json(spec) for name, spec in program.values.items()},
        "ops": dict(sorted(program.op_schemas.items())),
        "nodes": [{"name": n.name, "target": _readable_target(n), "args": _encode(list(n.args), n.name),
                   "kwargs": {k: _encode(v, n.name) for k, v in n.kwargs.items()},
                   "outputs": list(n.outputs)} for n in program.nodes],
        "state": dict(program.state),
        "state_updates": dict(program.state_updates),
        "input_checks": [{"input": c.input, "kind": c.kind, "bound": c.bound} for c in program.input_checks],
    }


def write_program(program, path) -> None:
    """Writes `program` to `path` (atomically: a temporary file, then a rename).

    Raises:
        ValueError: an argument, constant or op that the format cannot hold.
    """
    from safetensors.torch import save_file

    tensors = {name: t.detach().cpu().contiguous().clone() for name, t in program.constants.items()}
    graph = {
        "format": FORMAT,
        "manifest_hash": program.manifest_hash,
        "lowered_with": dict(program.lowered_with),
        **_graph_json(program),
        "constants": {name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                             "sha256": _sha256(t)} for name, t in tensors.items()},
        "token_inputs": dict(program.token_inputs),
        "token_outputs": list(program.token_outputs),
        "specializations": {str(size): _graph_json(p) for size, p in program.specializations.items()},
    }
    text = json.dumps(graph, sort_keys=True, separators=(",", ":"))
    metadata = {"etvk.format": str(FORMAT), "etvk.program": text,
                "etvk.program_sha256": hashlib.sha256(text.encode()).hexdigest()}
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(temporary), metadata=metadata)
        temporary.chmod(_created_file_mode())  # safetensors creates 0600; give the usual umask's
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)


def _created_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file (0666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# ---------------------------------------------------------------- reading


class _Malformed(Exception):
    """A fault of the graph, reported by `read_program` as a ProgramFileError."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise _Malformed(message)


def _decode(value, where: str):
    if isinstance(value, list):
        return [_decode(v, where) for v in value]
    if isinstance(value, dict):
        _require(len(value) == 1, f"{where}: an argument object must have one key, got {sorted(value)}")
        (tag, payload), = value.items()
        if tag in ("ref", "const"):
            _require(isinstance(payload, str), f"{where}: a {tag} must name a string")
            return Ref(payload) if tag == "ref" else Const(payload)
        _require(tag in _TAGS and isinstance(payload, str), f"{where}: unknown argument kind {tag!r}")
        try:
            decoded = _TAGS[tag][2](payload)
        except (KeyError, AttributeError, RuntimeError, TypeError):
            raise _Malformed(f"{where}: unknown {tag} {payload!r}") from None
        allowed = {"layout": _LAYOUT_NAMES, "memory_format": _MEMORY_FORMATS}.get(tag)
        _require(allowed is None or decoded in allowed, f"{where}: unsupported {tag} {payload!r}")
        return decoded
    _require(value is None or isinstance(value, (bool, int, float, str)),
             f"{where}: unsupported argument {value!r}")
    return value


def _spec(entry, where: str) -> ValueSpec:
    _require(isinstance(entry, dict) and isinstance(entry.get("shape"), list)
             and all(isinstance(s, int) and s >= 0 for s in entry["shape"])
             and entry.get("dtype") in _DTYPES and isinstance(entry.get("layout", None), (str, type(None))),
             f"{where}: a value needs a shape (ints >= 0), a dtype ({', '.join(_DTYPES)}) and a layout")
    return ValueSpec(tuple(entry["shape"]), _DTYPES[entry["dtype"]], entry.get("layout"))


def _nodes(graph: dict, values: dict, constants: dict) -> list[Node]:
    nodes, defined = [], set(graph["inputs"]) | set(graph["state"])
    for index, entry in enumerate(graph["nodes"]):
        where = f"node {index}"
        _require(isinstance(entry, dict) and isinstance(entry.get("name"), str)
                 and isinstance(entry.get("target"), str) and isinstance(entry.get("args"), list)
                 and isinstance(entry.get("kwargs"), dict) and isinstance(entry.get("outputs"), list),
                 f"{where}: needs name, target, args, kwargs and outputs")
        where = f"node {entry['name']!r}"
        node = Node(entry["name"], entry["target"], tuple(_decode(entry["args"], where)),
                    {k: _decode(v, where) for k, v in entry["kwargs"].items()}, tuple(entry["outputs"]))
        for leaf in walk_args((node.args, node.kwargs)):
            if isinstance(leaf, Ref):
                _require(leaf.name in defined, f"{where} reads {leaf.name!r}, which no earlier node or "
                                               "input defines")
            if isinstance(leaf, Const):
                _require(leaf.name in constants, f"{where} reads the unknown constant {leaf.name!r}")
        for out in node.outputs:
            _require(isinstance(out, str) and out in values and out not in defined,
                     f"{where}: output {out!r} is undeclared or defined twice")
            defined.add(out)
        nodes.append(node)
    for name in graph["outputs"]:
        _require(name in defined or name in constants, f"output {name!r} is not defined")
    return nodes


def _check_ops(nodes: list[Node], schemas: dict) -> None:
    for node in nodes:
        fault = _op_fault(node)
        _require(fault is None, fault)
        if node.is_etvk:
            want = schemas.get(node.target)
            have = get_op(node.target).schema
            _require(want is not None, f"node {node.name!r}: the schema of {node.target} is not recorded")
            _require(schema_reads(have, want), f"op {node.target} has changed: the file was written for "
                                               f"{want!r}, this runtime has {have!r}")


def schema_reads(have: str, want: str) -> bool:
    """Whether an op of schema `have` runs the nodes of a file written for schema `want`: the same
    schema, or `want` with arguments appended that all have defaults (an op that gained an
    optional argument; the file's nodes leave it out, so it takes its default)."""
    if have == want:
        return True
    head, sep, returns = want.rpartition(") -> ")
    if not (sep and have.startswith(head + ", ") and have.endswith(sep + returns)):
        return False
    try:
        old, new = torch._C.parse_schema(want), torch._C.parse_schema(have)
    except RuntimeError:
        return False
    return all(argument.has_default_value() for argument in new.arguments[len(old.arguments):])


def _open(path: Path):
    from safetensors import SafetensorError, safe_open

    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ProgramFileError(path, f"cannot read it ({exc.strerror})") from None
    if size == 0:
        raise ProgramFileError(path, "the file is empty")
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError, ValueError) as exc:
        raise ProgramFileError(path, f"not a program file, or truncated or corrupted ({exc})") from None


def read_program(path) -> dict:
    """Reads and checks a program file; returns the `Program` constructor's keyword arguments
    (``specializations`` as such keyword arguments too, by token count).

    Raises:
        ProgramFileError: the file and its fault (module docstring).
    """
    path = Path(path)
    handle = _open(path)
    metadata = handle.metadata() or {}
    if "etvk.program" not in metadata:
        raise ProgramFileError(path, "not an etvk program file (no etvk.program metadata)")
    if metadata.get("etvk.format") not in _READS:
        raise ProgramFileError(path, f"program format {metadata.get('etvk.format')!r}; this runtime "
                                     f"reads formats {', '.join(_READS)}: export the model again")
    text = metadata["etvk.program"]
    if hashlib.sha256(text.encode()).hexdigest() != metadata.get("etvk.program_sha256"):
        raise ProgramFileError(path, "the program graph is corrupted (checksum mismatch)")
    try:
        graph = json.loads(text)
        _require(isinstance(graph, dict), "the graph is not a JSON object")
        _require(isinstance(graph.get("constants"), dict) and isinstance(graph.get("manifest_hash"), str),
                 "the graph's 'constants' or 'manifest_hash' is missing")
        constants = _constants(path, handle, graph["constants"])
        program = _graph(graph, constants, "the graph")
        program["manifest_hash"] = graph["manifest_hash"]
        lowered_with = graph.get("lowered_with", {})  # absent in files from before
        _require(isinstance(lowered_with, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                        for k, v in lowered_with.items()),
                 "the graph's 'lowered_with' is not a mapping of library names to versions")
        program["lowered_with"] = dict(lowered_with)
        program.update(_token_counts(graph, constants, program))
    except json.JSONDecodeError as exc:
        raise ProgramFileError(path, f"the program graph is not valid JSON ({exc})") from None
    except _Malformed as exc:
        raise ProgramFileError(path, str(exc)) from None
    return program


def _graph(graph: dict, constants: dict, what: str) -> dict:
    """One graph's `Program` keyword arguments (constants and manifest hash apart), checked."""
    _require(isinstance(graph, dict), f"{what} is not a JSON object")
    for key, kind in (("inputs", list), ("outputs", list), ("values", dict), ("ops", dict),
                      ("nodes", list), ("output_tuple", bool), ("state", dict), ("state_updates", dict),
                      ("input_checks", list)):
        _require(isinstance(graph.get(key), kind), f"{what}'s {key!r} is missing or not a {kind.__name__}")
    values = {name: _spec(entry, f"value {name!r}") for name, entry in graph["values"].items()}
    _require(all(name in values for name in graph["inputs"]), "an input has no value entry")
    _check_state(graph, values, constants)
    nodes = _nodes(graph, values, constants)
    _check_ops(nodes, graph["ops"])
    made = {o for n in nodes for o in n.outputs} | set(graph["inputs"]) | set(graph["state"])
    _require(all(v in made for v in graph["state_updates"].values()),
             "a state update names a value that no node or input defines")
    return {"inputs": list(graph["inputs"]), "outputs": list(graph["outputs"]), "nodes": nodes,
            "values": values, "constants": constants, "output_tuple": graph["output_tuple"],
            "op_schemas": dict(graph["ops"]), "state": dict(graph["state"]),
            "state_updates": dict(graph["state_updates"]), "input_checks": _input_checks(graph)}


def _token_counts(graph: dict, constants: dict, main: dict) -> dict:
    """The token dimensions and the further graphs of a dynamic token count (none in format 2)."""
    inputs, outputs = graph.get("token_inputs", {}), graph.get("token_outputs", [])
    further = graph.get("specializations", {})
    _require(isinstance(inputs, dict) and isinstance(outputs, list) and isinstance(further, dict),
             "the graph's token_inputs, token_outputs or specializations are malformed")
    _require(all(name in main["inputs"] and isinstance(dim, int)
                 and 0 <= dim < len(main["values"][name].shape) for name, dim in inputs.items())
             and len(outputs) == (len(main["outputs"]) if inputs else 0)
             and all(d is None or isinstance(d, int) for d in outputs),
             "the token dimensions name unknown inputs or dimensions, or do not match the outputs")
    _require(not further or inputs, "specializations need token dimensions")
    specializations = {}
    for size, entry in further.items():
        what = f"the graph for {size} tokens a call"
        _require(size.isdigit() and int(size) > 0, f"specialization {size!r}: not a token count")
        program = _graph(entry, constants, what)
        _require(program["inputs"] == main["inputs"] and program["state"] == main["state"]
                 and all(program["values"][n].shape[d] == int(size) for n, d in inputs.items()),
                 f"{what}: its inputs, state or token dimensions differ from the program's")
        program["state"] = main["state"]
        specializations[int(size)] = program
    return {"token_inputs": dict(inputs), "token_outputs": list(outputs),
            "specializations": specializations}


def _check_state(graph: dict, values: dict, constants: dict) -> None:
    for name, start in graph["state"].items():
        _require(name in values and name not in graph["inputs"],
                 f"state {name!r} has no value entry, or is an input")
        _require(start is None or (start in constants and tuple(constants[start].shape) == values[name].shape
                                   and constants[start].dtype == values[name].dtype),
                 f"state {name!r} starts as {start!r}, which is not a constant of its shape and dtype")
    for name, value in graph["state_updates"].items():
        _require(name in graph["state"] and isinstance(value, str) and value in values
                 and values[value].shape == values[name].shape and values[value].dtype == values[name].dtype,
                 f"state update {name!r} -> {value!r}: not a state, or a value of another shape or dtype")


def _input_checks(graph: dict) -> list[InputCheck]:
    checks = []
    for entry in graph["input_checks"]:
        _require(isinstance(entry, dict) and entry.get("input") in graph["inputs"]
                 and entry.get("kind") in ("index", "position", "consecutive") and isinstance(entry.get("bound"), int)
                 and entry["bound"] > 0, f"input check {entry!r}: needs an input, a kind (index, "
                                        "position or consecutive) and a bound > 0")
        checks.append(InputCheck(entry["input"], entry["kind"], entry["bound"]))
    return checks


def _constants(path: Path, handle, listed: dict) -> dict:
    stored = set(handle.keys())
    missing = sorted(set(listed) - stored)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise _Malformed(f"missing constant {missing[0]!r}{more}")
    extra = sorted(stored - set(listed))
    if extra:
        raise _Malformed(f"unexpected constant {extra[0]!r} (not in the program graph)")
    constants = {}
    for name, entry in listed.items():
        spec = _spec({**entry, "layout": None}, f"constant {name!r}")
        try:
            tensor = handle.get_tensor(name)
        except Exception as exc:  # the library's own error types
            raise ProgramFileError(path, f"constant {name!r} cannot be read ({exc})") from None
        _require(tuple(tensor.shape) == spec.shape and tensor.dtype == spec.dtype,
                 f"constant {name!r} is {str(tensor.dtype).removeprefix('torch.')} of shape "
                 f"{list(tensor.shape)}; the program says {entry['dtype']} of shape {entry['shape']}")
        _require(_sha256(tensor) == entry.get("sha256"), f"constant {name!r} is corrupted (checksum "
                                                         "mismatch)")
        constants[name] = tensor
    return constants
