"""Running program nodes on the CPU, and the ops a program may name.

`resolve_op` maps a node's target to the PyTorch op that computes it on the
CPU: ``etvk.*`` targets to ``torch.ops.etvk`` (whose CPU kernels are the
references) and ``aten.*`` / ``quantized_decomposed.*`` targets to
``torch.ops``. Nothing else is ever called: a program file names ops, it
cannot name code. `run_on_cpu` runs a whole program that way (the reference
a loaded program is bit-exact against); the executor calls `run_node` for the
nodes placed on the CPU. Must not touch Vulkan. Used by program.py,
fileformat.py and executor.py.
"""

from __future__ import annotations

import logging

import torch

from runtime.errors import EtvkError
from runtime.programs.nodes import Const, Node, Ref, map_args

# Namespaces of the ops a program may call on the CPU (torchao's quantize ops, for 8da4w
# models, need torchao installed where the program runs).
CPU_NAMESPACES = ("aten", "quantized_decomposed", "torchao", "etvk")


class UnknownOp(EtvkError, ValueError):
    """A target that names no op this runtime may call."""


class ProgramInputError(EtvkError, ValueError):
    """A program was called with inputs of the wrong number, shape or dtype."""


def _load_namespace(namespace: str) -> None:
    """Imports what defines ``torch.ops.<namespace>`` (quantized_decomposed's module, torchao)."""
    if namespace == "quantized_decomposed":
        import torch.ao.quantization.fx._decomposed  # noqa: F401
    elif namespace == "torchao":
        # its CUDA libraries on a CPU torch, and torch's word on an enum it registers
        for noisy in ("torchao", "torch.utils._pytree"):
            logging.getLogger(noisy).setLevel(logging.ERROR)
        try:
            import torchao  # noqa: F401
        except ImportError as exc:
            raise UnknownOp(f"torchao ops need torchao installed ({exc})") from None


def resolve_op(target: str) -> torch._ops.OpOverload:
    """The PyTorch op overload of a target such as ``"aten.max_pool2d.default"``.

    Raises:
        UnknownOp: another namespace, or no such op or overload.
    """
    parts = target.split(".")
    if len(parts) != 3 or parts[0] not in CPU_NAMESPACES:
        raise UnknownOp(f"unknown op {target!r}: a program may call "
                        f"{', '.join(f'{n}.<op>.<overload>' for n in CPU_NAMESPACES)} ops")
    namespace, name, overload = parts
    _load_namespace(namespace)
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise UnknownOp(f"unknown op {target!r}: no such op in this PyTorch / runtime") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise UnknownOp(f"unknown op {target!r}")
    return op


def check_inputs(program, inputs: tuple, what: str = "program") -> list[torch.Tensor]:
    """The inputs as CPU tensors of the program's input specs.

    Raises:
        ProgramInputError: a wrong count, type, shape or dtype; names the input.
    """
    if len(inputs) != len(program.inputs):
        raise ProgramInputError(f"{what} takes {len(program.inputs)} input(s) "
                                f"({', '.join(program.inputs)}), got {len(inputs)}")
    checked = []
    for index, (name, value) in enumerate(zip(program.inputs, inputs, strict=True)):
        spec = program.values[name]
        if not isinstance(value, torch.Tensor):
            raise ProgramInputError(f"{what}: input {index} ({name!r}) must be a torch tensor, "
                                    f"got {type(value).__name__}")
        if tuple(value.shape) != spec.shape or value.dtype != spec.dtype:
            raise ProgramInputError(
                f"{what}: input {index} ({name!r}) must be {spec.dtype} of shape {list(spec.shape)}, "
                f"got {value.dtype} of shape {list(value.shape)}")
        checked.append(value.detach().cpu())
    return checked


def run_node(node: Node, env: dict, constants: dict) -> None:
    """Runs one node on the CPU: reads its arguments from `env` and `constants`, writes its outputs."""
    def arg(a):
        if isinstance(a, Ref):
            return env[a.name]
        if isinstance(a, Const):
            return constants[a.name]
        return a

    result = resolve_op(node.target)(*map_args(node.args, arg), **map_args(node.kwargs, arg))
    results = result if isinstance(result, (tuple, list)) else (result,)
    for name, value in zip(node.outputs, results, strict=False):
        env[name] = value


def run_on_cpu(program, inputs: tuple, state: dict[str, torch.Tensor] | None = None):
    """Runs every node of `program` on the CPU; returns its outputs (a tensor or a tuple).

    Args:
        program: the `Program`.
        inputs: its inputs, in order.
        state: the program's state values, replaced by their updates when the call ends;
            None: a fresh `Program.initial_state`, dropped afterwards.

    Raises:
        ProgramInputError: bad inputs.
        UnknownOp: a node names an op this runtime does not have.
    """
    env = dict(zip(program.inputs, check_inputs(program, inputs), strict=True))
    state = program.initial_state() if state is None else state
    env.update((name, state[name]) for name in program.state)
    for node in program.nodes:
        run_node(node, env, program.constants)
    state.update((name, env[value]) for name, value in program.state_updates.items())
    outputs = tuple(env[name] if name in env else program.constants[name] for name in program.outputs)
    return outputs if program.output_tuple else outputs[0]
