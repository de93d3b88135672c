"""Programs with state: a buffer the export mutates (functionally, or in place as transformers'
static cache is) lives across calls of a loaded program, starts at zero, and is reset.

A hand-written cache module (functional buffer mutations in the signature)
and a small Llama from ``transformers`` quantized 8da4w (in-place
``index_copy_`` on its static cache) are lowered, saved, loaded and called
token by token: bit-exact against the program's reference run with the same
state, and against PyTorch's own run of the exported module (teacher
forcing). Input checks, keyword calls, reset and the file's state records.
"""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import runtime
from runtime.programs.cpu import ProgramInputError
from runtime.programs.from_export import LoweringError
from runtime.programs.input_checks import InputValueError

LENGTH, DIM = 8, 4


class Cache(nn.Module):
    """Writes x into a cache buffer at `pos` and returns the running sum of what it holds."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(1, LENGTH, DIM))
        self.register_buffer("scale", torch.full((DIM,), 2.0))  # read only: stays a constant

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, x * self.scale)
        return self.cache.cumsum(1)


def calls(count: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 1, DIM, generator=gen), torch.tensor([i])) for i in range(count)]


@pytest.fixture(scope="module", params=["in_place", "functional"])
def cache_program(request, tmp_path_factory):
    """(exported, lowered, file): as ``torch.export`` gives it (``index_copy_`` on the buffer),
    or functionalized (``index_copy``, the buffer mutation in the signature)."""
    exported = torch.export.export(Cache(), calls(1)[0])
    if request.param == "functional":
        exported = exported.run_decompositions({})
    program = runtime.lower(exported)
    path = tmp_path_factory.mktemp("state") / f"cache_{request.param}.etvk"
    program.save(path)
    return exported, program, path


def test_a_buffer_mutation_becomes_state_that_starts_at_zero(cache_program):
    exported, program, path = cache_program
    (name,) = program.state
    assert program.state[name] is None and program.values[name].shape == (1, LENGTH, DIM)
    assert program.state_updates[name] in {o for n in program.nodes for o in n.outputs}
    assert not any(n.target.endswith("_.default") or n.target.endswith("_.Tensor") for n in program.nodes)
    assert not any(t.shape == (1, LENGTH, DIM) for t in program.constants.values())  # no zeros stored
    again = runtime.Program.load(path)
    assert (again.state, again.state_updates, again.input_checks) == \
        (program.state, program.state_updates, program.input_checks)
    assert [(c.input, c.kind, c.bound) for c in program.input_checks] == [("pos", "position", LENGTH)]


def test_the_state_lives_across_calls_and_reset_starts_again(cache_program):
    exported, program, path = cache_program
    loaded = runtime.load(path)
    eager, state = exported.module(), program.initial_state()
    for x, pos in calls(LENGTH):
        got = loaded(x, pos=pos)
        assert torch.equal(got, program.run_reference(x, pos, state=state))
        torch.testing.assert_close(got, eager(x, pos), rtol=0, atol=1e-6)
    loaded.reset()
    x, pos = calls(1, seed=3)[0]
    assert torch.equal(loaded(x, pos), program.run_reference(x, pos))  # a fresh state: zeros


def test_bad_calls_name_the_input(cache_program):
    loaded = runtime.load(cache_program[2])
    x, pos = calls(1)[0]
    with pytest.raises(InputValueError, match=r"input 'pos' holds the position 8, outside \[0, 8\)"):
        loaded(x, torch.tensor([LENGTH]))
    loaded(x, torch.tensor([2]))
    with pytest.raises(InputValueError, match=r"input 'pos' goes backwards: it starts at 1, but the "
                                              r"previous call wrote up to 2; call reset\(\)"):
        loaded(x, torch.tensor([1]))
    loaded.reset()
    loaded(x, torch.tensor([1]))
    with pytest.raises(ProgramInputError, match="no input named 'position'; its inputs are x, pos"):
        loaded(x, position=pos)
    with pytest.raises(ProgramInputError, match="input 'x' given by position and by name"):
        loaded(x, x=x, pos=pos)
    with pytest.raises(ProgramInputError, match="missing input"):
        loaded(x=x)


class WritesInput(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class WritesParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3), requires_grad=False)

    def forward(self, x):
        self.w.add_(x)
        return self.w * 1


class WritesView(Cache):
    def forward(self, x, pos):
        self.cache[:, :2].index_copy_(1, pos, x)
        return self.cache * 1


@pytest.mark.parametrize("module, inputs, message", [
    (WritesInput(), (torch.ones(3),), "aten.add_.Tensor writes the program input x"),
    (WritesParameter(), (torch.ones(3),), "aten.add_.Tensor writes the constant p_w in place"),
    (WritesView(), calls(1)[0], "aten.index_copy_.default writes a view of b_cache in place"),
], ids=["input", "parameter", "view"])
def test_writes_a_program_cannot_express_are_refused(module, inputs, message):
    with pytest.raises(LoweringError, match=message):
        runtime.lower(torch.export.export(module, inputs))


class DropoutInPlaceOnAView(nn.Module):
    """A classifier's Dropout(inplace=True) in eval mode, as PT2E exports of some torch
    versions keep it: an in-place write to a view, which changes nothing."""

    def forward(self, x):
        flat = torch.ops.aten.dropout_.default(x.relu().flatten(1), 0.2, False)
        return flat * 2


def test_an_in_place_dropout_in_eval_mode_is_no_write():
    program = runtime.lower(torch.export.export(DropoutInPlaceOnAView(), (torch.randn(2, 3, 4),)))
    assert "aten.dropout_.default" not in {n.target for n in program.nodes}
    x = torch.randn(2, 3, 4)
    assert torch.equal(program.run_reference(x), x.relu().flatten(1) * 2)


class Total(nn.Module):
    """A running total kept in a buffer: each call adds its input and returns the new total."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x)
        return self.total * 1.0


def test_calls_from_several_threads_are_serialized(tmp_path):
    """Each call reads and updates the state as one step: with distinct integer-valued inputs
    (sums exact in fp32), the totals the calls return, sorted, are the running sums of some
    order of the inputs, and the last one is the sum of them all. On the device: the add and
    its update run there, the update copied into the state after its segment."""
    runtime.lower(torch.export.export(Total(), (torch.ones(4),))).save(tmp_path / "total.etvk")
    loaded = runtime.load(tmp_path / "total.etvk")
    assert loaded.state_placement() == {"b_total": "vulkan"}
    inputs = [torch.full((4,), float(2 ** i)) for i in range(16)]  # every subset sum is distinct
    results: dict[int, torch.Tensor] = {}

    def worker(first: int) -> None:
        for i in range(first, len(inputs), 4):
            results[i] = loaded(inputs[i])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals = sorted(results.values(), key=lambda t: float(t[0]))
    steps = [totals[0]] + [b - a for a, b in zip(totals, totals[1:], strict=False)]
    assert sorted(float(s[0]) for s in steps) == [float(2 ** i) for i in range(16)]
    assert all(torch.equal(s, s[:1].expand(4)) for s in steps)
    assert torch.equal(totals[-1], torch.full((4,), float(2 ** 16 - 1)))


def test_an_in_place_write_whose_old_value_is_read_later_runs_on_the_cpu():
    """etvk.cache_update writes its cache in place on the device; where a later node still reads
    the cache as it was, the write falls back to the CPU (its reference is functional)."""
    from runtime.programs.nodes import Node, Ref, ValueSpec
    from runtime.programs.program import Program

    cache = (1, 2, LENGTH, DIM)
    values = {"cache": ValueSpec(cache, torch.float32), "pos": ValueSpec((1,), torch.int32),
              "v": ValueSpec((1, 1, 2, DIM), torch.float32), "new": ValueSpec(cache, torch.float32),
              "old": ValueSpec(cache, torch.float32)}
    nodes = [Node("write", "etvk.cache_update.default", (Ref("cache"), Ref("pos"), Ref("v")), {}, ("new",)),
             Node("keep", "etvk.scalar.default", (Ref("cache"), 1.0, "mul"), {}, ("old",))]
    program = Program(inputs=["pos", "v"], outputs=["old"], nodes=nodes, values=values, constants={},
                      output_tuple=False, state={"cache": None}, state_updates={"cache": "new"})
    loaded = runtime.LoadedProgram(program)
    rows = {r["node"]: r for r in loaded.placement()}
    assert rows["write"]["runs_on"] == "cpu" and "writes cache in place" in rows["write"]["reason"]
    state = program.initial_state()
    for step in range(3):
        pos, v = torch.tensor([step], dtype=torch.int32), torch.full((1, 1, 2, DIM), step + 1.0)
        assert torch.equal(loaded(pos, v), program.run_reference(pos, v, state=state))
    # the fourth call returns the cache as the third left it: its position 2 holds 3.0
    assert float(loaded(torch.tensor([3], dtype=torch.int32), v)[0, 0, 2, 0]) == 3.0
