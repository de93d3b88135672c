"""Inputs and models the program tests share (imported by conftest.py and the tests)."""

from __future__ import annotations

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers torch.ops.quantized_decomposed)
from torch import nn
from torch.nn import functional as F

SHAPE = (1, 3, 16, 16)
QD = torch.ops.quantized_decomposed


def q(x, scale, zero_point):
    """int8 per-tensor quantize, as PT2E writes it in the pattern tests' hand-written graphs."""
    return QD.quantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)


def dq(x, scale, zero_point):
    """int8 per-tensor dequantize, as PT2E writes it."""
    return QD.dequantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)


class Int8Convs(nn.Module):
    """Two seeded per-channel int8 conv weights of 6 channels, ``w3`` (3x3) and ``w1`` (1x1), for
    hand-written quantized graphs: ``self.conv(x, "w3", padding=1)`` convolves with the
    dequantized weight, as PT2E's graphs do."""

    def __init__(self, seed: int):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        for name, shape in (("w3", (6, 6, 3, 3)), ("w1", (6, 6, 1, 1))):
            self.register_buffer(f"{name}_w", torch.randint(-127, 128, shape, generator=gen, dtype=torch.int8))
            self.register_buffer(f"{name}_s", torch.rand(6, generator=gen) * 0.01 + 0.002)
        self.register_buffer("zeros", torch.zeros(6, dtype=torch.int64))

    def conv(self, x, name, **kwargs):
        w = QD.dequantize_per_channel(getattr(self, f"{name}_w"), getattr(self, f"{name}_s"), self.zeros, 0,
                                      -127, 127, torch.int8)
        return F.conv2d(x, w, **kwargs)


def random_batches(count: int, shape=SHAPE, seed: int = 0) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen),) for _ in range(count)]


def maps_and_gate(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two fp32 [2, 6, 9, 9] maps and a [2, 6, 1, 1] gate: the inputs of the CNN and residual
    pattern modules."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 6, 9, 9, generator=gen), torch.randn(2, 6, 9, 9, generator=gen),
            torch.randn(2, 6, 1, 1, generator=gen))


def check_device_runs(path, program, inputs_of, seeds=(1, 2)) -> None:
    """The program file `path` loads with every node on the device, and each seed's outputs
    (inputs ``inputs_of(seed)``) equal the reference run's of `program`, bit for bit."""
    import runtime

    loaded = runtime.load(path)
    assert {r["runs_on"] for r in loaded.placement()} == {"vulkan"}
    for seed in seeds:
        inputs = inputs_of(seed)
        for got, want in zip(loaded(*inputs), program.run_reference(*inputs), strict=True):
            assert torch.equal(got, want)


def lower_and_save(module: nn.Module, inputs: tuple, folder) -> tuple:
    """(exported, lowered program, its file in `folder`): `module` in eval mode exported on
    `inputs`, lowered and saved, as the pattern tests' fixtures take it."""
    import runtime

    exported = torch.export.export(module.eval(), inputs)
    program = runtime.lower(exported)
    path = folder / f"{type(module).__name__.lower()}.etvk"
    program.save(path)
    return exported, program, path


def fx_values(exported, inputs: tuple) -> dict[str, torch.Tensor]:
    """Every node's value (by FX node name) in one run of the exported module on `inputs`."""
    env = {}

    class Capture(torch.fx.Interpreter):
        def run_node(self, n):
            env[n.name] = super().run_node(n)
            return env[n.name]

    Capture(exported.module()).run(*inputs)
    return env


def int8_agreement(exported, program, inputs: tuple) -> dict[str, tuple[int, int, int]]:
    """Teacher forcing: each lowered int8 op fed PyTorch's own int8 inputs, against its int8 output.

    Runs the quantized model (the converted PT2E module) once on `inputs`,
    keeping every intermediate, then evaluates the reference kernel of each
    ``etvk`` node with an int8 output that PyTorch's run also has (a lowered
    pattern keeps the name of the quantize it ends with) on the values PyTorch
    produced for its inputs.

    Returns:
        op -> (elements compared, exactly equal, worst difference in steps).
    """
    from runtime.programs.cpu import resolve_op
    from runtime.programs.layouts import resolve_layouts
    from runtime.programs.nodes import Const, Ref

    program = resolve_layouts(program, "other")  # any family: the values do not depend on layouts
    env = fx_values(exported, inputs)
    found: dict[str, tuple[int, int, int]] = {}
    for node in program.nodes:
        reads = [a.name for a in node.args if isinstance(a, Ref)]
        if not node.is_etvk or node.outputs[0] not in env or not all(r in env for r in reads) \
                or env[node.outputs[0]].dtype != torch.int8:
            continue
        args = [env[a.name] if isinstance(a, Ref) else program.constants[a.name] if isinstance(a, Const)
                else a for a in node.args]
        steps = (resolve_op(node.target)(*args, **node.kwargs).int() - env[node.outputs[0]].int()).abs()
        total, exact, worst = found.get(node.target, (0, 0, 0))
        found[node.target] = (total + steps.numel(), exact + int((steps == 0).sum()),
                              max(worst, int(steps.max())))
    return found


def check_agreement(name: str, exported, program, inputs: tuple, capsys) -> None:
    """Prints the teacher-forced agreement of every lowered int8 op kind with PyTorch and the
    (first) output's SQNR, and holds them to OPS.md: at most one step, at least 99 % exact."""
    found = int8_agreement(exported, program, inputs)
    ours, theirs = program.run_reference(*inputs), exported.module()(*inputs)
    sqnr = sqnr_db(ours[0], theirs[0]) if isinstance(ours, tuple) else sqnr_db(ours, theirs)
    with capsys.disabled():
        print(f"\n{name} vs PyTorch (int8 outputs exact, worst step), output SQNR {sqnr:.1f} dB:")
        for target, (total, exact, worst) in sorted(found.items()):
            print(f"  {target}: {exact}/{total} ({100 * exact / total:.3f} %), worst {worst}")
    assert "etvk.q8ta_conv2d.default" in found
    for total, exact, worst in found.values():
        assert worst <= 1 and exact / total >= 0.99


def sqnr_db(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of `ours` against `theirs`, in dB."""
    noise = (ours.double() - theirs.double()).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(theirs.double().pow(2).sum() / noise))
