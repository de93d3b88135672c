"""One golden render per template kind: fixture GLSL, the stub module, the manifest, quantize.

Set UPDATE_GOLDEN=1 to rewrite tests/codegen/expected/ after an intended change.
"""

from __future__ import annotations

import os

import pytest
from codegen_testlib import HERE, REPO, make_tree

from codegen.build import build

EXPECTED = HERE / "expected"


def check_golden(name: str, text: str) -> None:
    path = EXPECTED / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs; rerun with UPDATE_GOLDEN=1 if intended"


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory):
    tree = make_tree(tmp_path_factory.mktemp("toy"))
    return build(tree["specs"], tree["templates"]).plan


@pytest.mark.parametrize(
    "path,golden",
    [
        ("glsl/scale_buffer_half.comp", "scale_buffer_half.comp"),
        ("glsl/scale_texture3d_float.comp", "scale_texture3d_float.comp"),
        ("ops/toy.py", "toy_ops.py.txt"),
        ("manifest.json", "toy_manifest.json"),
    ],
)
def test_toy_render(toy_plan, path, golden):
    check_golden(golden, toy_plan[path])


QUANTIZE_TEMPLATES = [REPO / "templates" / f"{t}.glsl.j2" for t in ("quantize", "dequantize", "choose_qparams")]


@pytest.mark.skipif(not all(p.exists() for p in QUANTIZE_TEMPLATES), reason="quantize templates not written yet")
@pytest.mark.parametrize(
    "variant",
    [
        "quantize_per_token_buffer_half_int8",
        "dequantize_per_tensor_texture3d_uint8_float",
        "choose_qparams_per_token_asymmetric_buffer_float",
    ],
)
def test_quantize_render(variant):
    plan = build(REPO / "op_specs", REPO / "templates").plan
    check_golden(f"{variant}.comp", plan[f"glsl/{variant}.comp"])
