"""Variant expansion: product - exclude + combos, order, overrides, empty expansion."""

from __future__ import annotations

import pytest
from codegen_testlib import FIXTURES

from codegen.errors import Diagnostics
from codegen.spec import parse_family
from codegen.variants import expand_variants
from codegen.yaml_loader import load_yaml

SHADER = """
family: f
shaders:
  s:
    template: t.glsl.j2
    axes:
      A: [a1, a2]
      B: [float32, float16, int8]
{extra}
"""


def shader(extra: str = ""):
    root, errors = load_yaml(SHADER.format(extra=extra), "f.yaml")
    family, errors2 = parse_family(root, "f.yaml")
    assert not errors and not errors2, errors + errors2
    return family.shaders[0]


CASES = [
    # (extra yaml, expected variant names in order)
    ("", ["s_a1_float", "s_a1_half", "s_a1_int8", "s_a2_float", "s_a2_half", "s_a2_int8"]),
    ("    exclude:\n      - {A: a2}\n", ["s_a1_float", "s_a1_half", "s_a1_int8"]),
    ("    exclude:\n      - {B: [float16, int8]}\n", ["s_a1_float", "s_a2_float"]),
    (
        "    exclude:\n      - {A: a2}\n    combos:\n      - {A: a2, B: int8}\n",
        ["s_a1_float", "s_a1_half", "s_a1_int8", "s_a2_int8"],
    ),
    ("    exclude:\n      - {A: a1, B: int8}\n", ["s_a1_float", "s_a1_half", "s_a2_float", "s_a2_half", "s_a2_int8"]),
]


@pytest.mark.parametrize("extra,names", CASES)
def test_expansion(extra, names):
    variants, errors = expand_variants(shader(extra))
    assert not errors
    assert [v.name for v in variants] == names


def test_overrides_later_wins():
    extra = (
        "    workgroup: [64, 1, 1]\n"
        "    spec_constants:\n      - {name: TILE, type: int, default: 4}\n"
        "    overrides:\n"
        "      - {when: {A: a2}, workgroup: [8, 8, 1], spec_constants: {TILE: 2}}\n"
        "      - {when: {A: a2, B: int8}, spec_constants: {TILE: 1}}\n"
    )
    by_name = {v.name: v for v in expand_variants(shader(extra))[0]}
    assert by_name["s_a1_float"].workgroup == (64, 1, 1)
    assert by_name["s_a1_float"].spec_defaults == {"TILE": 4}
    assert by_name["s_a2_half"].workgroup == (8, 8, 1)
    assert by_name["s_a2_half"].spec_defaults == {"TILE": 2}
    assert by_name["s_a2_int8"].spec_defaults == {"TILE": 1}


def test_empty_expansion_is_an_error():
    variants, errors = expand_variants(shader("    exclude:\n      - {A: [a1, a2]}\n"))
    assert variants == []
    assert "expands to no variants" in errors[0].message


def test_bad_axis_refs_are_errors():
    _, errors = expand_variants(shader("    exclude:\n      - {C: x}\n      - {A: a3}\n"))
    assert [e.message.split(" in ")[0] for e in errors] == ["unknown axis 'C'", "unknown value 'a3' for axis A"]


def test_toy_fixture_variants():
    diags = Diagnostics()
    root, _ = load_yaml((FIXTURES / "specs" / "toy.yaml").read_text(), "toy.yaml")
    family, errors = parse_family(root, "toy.yaml")
    assert not errors and not diags
    variants, _ = expand_variants(family.shaders[0])
    assert [(v.name, v.workgroup) for v in variants] == [
        ("scale_buffer_float", (64, 1, 1)),
        ("scale_buffer_half", (64, 1, 1)),
        ("scale_texture3d_float", (8, 8, 1)),
    ]
