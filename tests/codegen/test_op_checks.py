"""An op's `checks`: names, inline checks and nested lists (a YAML alias of another op's
list) resolve in order; the golden cases hold the errors."""

from __future__ import annotations

from codegen_testlib import HERE

from codegen.spec import parse_family
from codegen.stubs import _negate
from codegen.yaml_loader import load_yaml


def test_an_aliased_check_list_counts_as_its_items_in_place():
    text = (HERE / "golden" / "check_alias.yaml").read_text()
    text = text.replace("      - postive\n      - [[7]]\n", "      - [[positive]]\n")
    root, errors = load_yaml(text, "check_alias.yaml")
    family, errors2 = parse_family(root, "check_alias.yaml")
    assert not errors and not errors2, errors + errors2
    checks = {op.name: [(c.name, c.arg) for c in op.checks] for op in family.ops}
    assert checks == {
        "scale": [("positive", "scale"), ("positive", "scale")],
        "scale_again": [("positive", "scale"), ("positive", "scale"), ("", "input")],
    }


def test_a_failed_check_reads_as_linters_want_it():
    """The stub raises where the condition fails: a membership or identity test flips its
    operator, anything else is negated whole."""
    assert _negate("x is None") == "x is not None"
    assert _negate("f(a) is not None") == "f(a) is None"
    assert _negate("layout in ('4C', '4W4C')") == "layout not in ('4C', '4W4C')"
    assert _negate("x is None or y is None") == "not (x is None or y is None)"
