"""Programs whose inputs have names that Python or torch.fx rename: lowered, saved, loaded, run.

``torch.export`` names a placeholder after its ``forward`` argument; copying
the graph renames a placeholder whose name is a Python builtin (``input``,
``type``, ``list``: every ``nn.Sequential`` takes ``input``) or collides with
a node's name. The lowering keeps the signature and the placeholders
consistent whatever the names, and every compute node still runs on Vulkan.
"""

from __future__ import annotations

import pytest
import torch
from program_cases import random_batches
from torch import nn

import runtime
from runtime.pytorch.passes import fuse_quantized_ops

SHAPE = (1, 8, 12, 12)


def sequential():
    return nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 1), nn.ReLU())


class Type(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = sequential()

    def forward(self, type):  # noqa: A002  (the name under test)
        return self.body(type)


class List(Type):
    def forward(self, list):  # noqa: A002
        return self.body(list)


class NodeName(Type):
    """The argument is named like the node export makes for the first conv."""

    def forward(self, conv2d):
        return self.body(conv2d)


class Two(nn.Module):
    """Two inputs, each through its own conv, added: ``input`` and ``relu`` (a node's name)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(8, 16, 1)

    def forward(self, input, relu):  # noqa: A002
        return torch.relu(self.a(input) + torch.relu(self.b(relu)))


CASES = {"sequential": (sequential, 1), "type": (Type, 1), "list": (List, 1),
         "node_name": (NodeName, 1), "two_inputs": (Two, 2)}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    from runtime.tools.models import quantize_pt2e

    make, inputs = CASES[request.param]
    torch.manual_seed(0)
    batches = [tuple(b[0] for b in random_batches(inputs, SHAPE, seed=s)) for s in range(3)]
    return quantize_pt2e(make(), batches[0], batches[1:]), batches


def test_the_fusion_pass_keeps_signature_and_placeholders_consistent(case):
    exported, batches = case
    fused = fuse_quantized_ops(exported)  # its ExportedProgram verifies the signature when built
    placeholders = [n.name for n in fused.graph.nodes if n.op == "placeholder"]
    assert [s.arg.name for s in fused.graph_signature.input_specs] == placeholders
    assert torch.equal(fused.module()(*batches[0]), exported.module()(*batches[0]))


def test_lowers_saves_loads_and_runs_on_vulkan(case, tmp_path):
    exported, batches = case
    program = runtime.lower(exported)
    assert len(program.inputs) == len(exported.graph_signature.user_inputs)
    program.save(tmp_path / "model.etvk")
    loaded = runtime.load(tmp_path / "model.etvk")
    assert [r for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    for batch in batches:
        assert torch.equal(loaded(*batch), program.run_reference(*batch))
