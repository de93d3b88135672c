"""Variant names: short forms and the parse round-trip over every real and toy variant."""

from __future__ import annotations

import pytest
from codegen_testlib import FIXTURES, REPO

from codegen.build import expand, load_families
from codegen.errors import Diagnostics
from codegen.naming import parse_variant_name, registry_key, short_value, variant_name


def all_variants():
    out = []
    for folder in (REPO / "op_specs", FIXTURES / "specs"):
        diags = Diagnostics()
        out += expand(load_families(folder, diags), diags).variants
        assert not diags, diags.errors
    return out


VARIANTS = all_variants()


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_round_trip(variant):
    axes = {a.name: a.values for a in variant.shader.axes}
    assert parse_variant_name(variant.name, variant.shader.name, axes) == variant.axes
    assert variant_name(variant.shader.name, list(variant.axes.values())) == variant.name


def test_short_forms_and_example():
    assert short_value("float32") == "float"
    assert short_value("float16") == "half"
    assert short_value("int8") == "int8"
    name = variant_name("quantize", ["per_tensor", "texture3d", "float32", "int8"])
    assert name == "quantize_per_tensor_texture3d_float_int8"
    assert registry_key("quantize_per_tensor") == "etvk.quantize_per_tensor.default"


def test_values_with_underscores_backtrack():
    axes = {"A": ["x", "x_y"], "B": ["y_z", "z"]}
    assert parse_variant_name("s_x_y_z", "s", axes) == {"A": "x", "B": "y_z"}
    assert parse_variant_name("s_x_y_y_z", "s", axes) == {"A": "x_y", "B": "y_z"}


@pytest.mark.parametrize("name", ["t_x_z", "s_q_z", "s_x", "s_x_z_extra"])
def test_bad_names_raise(name):
    with pytest.raises(ValueError):
        parse_variant_name(name, "s", {"A": ["x"], "B": ["z"]})
