"""The op of one's own in examples/custom_op: generated from its own folder, loaded next to the
built-in ops, its variant checked against its reference on every layout, and the refusals
(a clashing name, another format) clear."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import runtime
from codegen.__main__ import main as codegen_main
from runtime.errors import ArgumentError
from runtime.ops.library import ManifestError
from runtime.vulkan.layouts import PACKED_LAYOUTS, pack, packed_words
from runtime.vulkan.stream import Stream
from runtime.vulkan.tensor import Tensor

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_op"
OP = "etvk.q8ta_hardswish.default"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The example generated into a temporary folder (as the README shows) and loaded once."""
    out = tmp_path_factory.mktemp("my_ops") / "generated"
    status = codegen_main(["generate", "--specs", str(EXAMPLE / "op_specs"), "--templates",
                           str(EXAMPLE / "templates"), "--out", str(out)])
    assert status == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))  # the reference module, for torch.ops.etvk's CPU kernel
        assert runtime.load_ops(out) == [OP]
        yield out


def _inputs(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8)


CASES = [  # (shape, input scale, input zero point, output scale, output zero point)
    ((1, 8, 4, 4), 0.05, 0, 0.04, 0),
    ((2, 6, 5, 7), 0.031, 3, 0.027, -5),      # C and W not multiples of 4
    ((1, 3, 2, 9), 0.1, -100, 0.01, 120),     # saturating both ways
]


@pytest.mark.parametrize("layout", PACKED_LAYOUTS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_every_layout_matches_the_reference_bit_for_bit(generated, layout, case, dispatch_trace):
    shape, *qparams = case
    x = _inputs(shape, len(shape) + shape[-1])
    op = runtime.get_op(OP)
    [variant] = op.variants
    with Stream() as stream:
        out = op.record(stream, Tensor.from_torch(x, layout=layout), *qparams)
        stream.run()
        words = torch.empty(packed_words(shape, layout) * 4, dtype=torch.int8)
        out.memory.read(words.data_ptr(), words.numel())
    assert out.layout == layout
    want = torch.ops.etvk.q8ta_hardswish.default(x, *qparams)
    assert torch.equal(out.to_torch(), want)
    # Padding bytes stay 0: repacking the result reproduces the device words exactly.
    assert torch.equal(words, pack(want, layout))
    assert variant.name in dispatch_trace()


def test_host_input_and_agreement_with_pytorch(generated):
    x = _inputs((2, 16, 6, 6), 7)
    got = runtime.get_op(OP)(x, 0.04, 2, 0.03, -3)
    fp = torch.nn.functional.hardswish((x.float() - 2) * 0.04)
    torch_q = torch.clamp(torch.round(fp / 0.03) - 3, -128, 127).to(torch.int8)
    steps = (got.int() - torch_q.int()).abs()
    assert steps.max() <= 1 and (steps == 0).float().mean() > 0.99


def test_bad_arguments_name_the_op_and_argument(generated):
    op = runtime.get_op(OP)
    with pytest.raises(ArgumentError, match=rf"{OP}: argument 'output_scale': must be a finite number > 0"):
        op(_inputs((1, 4, 2, 2), 1), 0.1, 0, -1.0, 0)
    with pytest.raises(ArgumentError, match=rf"{OP}: argument 'x': must be an int8 \[N, C, H, W\] tensor"):
        op(torch.zeros(4, 4), 0.1, 0, 0.1, 0)


def test_a_second_copy_is_refused_naming_both_sources(generated, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(generated, twin)
    with pytest.raises(ManifestError, match=rf"op {OP} from {twin}/manifest.json \(op_specs/hardswish.yaml:"
                                            rf"\d+\) clashes with the registered {OP} from {generated}/"):
        runtime.load_ops(twin)


def test_another_format_is_refused(generated, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(generated, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["format"] = 1
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"has format 1 .* this runtime reads format 2: regenerate it"):
        runtime.load_ops(old)
