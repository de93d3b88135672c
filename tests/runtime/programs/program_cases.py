"""Inputs and models the program tests share (imported by conftest.py and the tests)."""

from __future__ import annotations

import torch

SHAPE = (1, 3, 16, 16)


def random_batches(count: int, shape=SHAPE, seed: int = 0) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen),) for _ in range(count)]


def conv_agreement(exported, program, inputs: tuple) -> tuple[int, int, int]:
    """Teacher forcing: each lowered conv fed PyTorch's own int8 input, against PyTorch's int8 output.

    Runs the quantized model (the converted PT2E module) once on `inputs`,
    keeping every intermediate, then evaluates each ``etvk.q8ta_conv2d`` node's
    reference kernel on the int8 tensor PyTorch produced for its input.

    Returns:
        (elements compared, exactly equal, worst difference in steps), over all convs.
    """
    from runtime.programs.nodes import Const, Ref

    env = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n):
            env[n.name] = super().run_node(n)
            return env[n.name]

    Capture(exported.module()).run(*inputs)
    total = exact = worst = 0
    for conv in (n for n in program.nodes if n.target == "etvk.q8ta_conv2d.default"):
        args = [env[a.name] if isinstance(a, Ref) else program.constants[a.name] if isinstance(a, Const)
                else a for a in conv.args]
        steps = (torch.ops.etvk.q8ta_conv2d.default(*args).int() - env[conv.outputs[0]].int()).abs()
        total, exact, worst = total + steps.numel(), exact + int((steps == 0).sum()), max(worst, int(steps.max()))
    return total, exact, worst


def sqnr_db(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `ours` against `theirs`, in dB."""
    noise = (ours.double() - theirs.double()).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(theirs.double().pow(2).sum() / noise))
