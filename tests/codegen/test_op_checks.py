"""An op's `checks`: names (the file's own or imported from another spec file), inline checks
and nested lists (a YAML alias of another op's list) resolve in order; the golden cases hold
the errors."""

from __future__ import annotations

from codegen_testlib import HERE, make_tree

from codegen.build import build
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


def test_an_imported_check_is_the_defining_files_and_the_stub_raises_its_message(tmp_path):
    """main.yaml imports `finite` from shared.yaml and `from_base` from base.yaml (which
    shared.yaml imports too): the op's checks are the defining files' own, and the importing
    family's stub module has its own function for each, raising the defined message."""
    folder = HERE / "golden" / "check_imports"
    specs = {p.name: p.read_text() for p in folder.glob("*.yaml")}
    bad_imports = "  shared.yaml: [positive, finite, finit, from_base, finite]\n  sharde.yaml: [whatever]\n"
    bad_checks = "[positive, finite, finit, from_base, whatever, unknwon]"
    main = specs["main.yaml"]
    assert bad_imports in main and bad_checks in main
    main = main.replace(bad_imports, "  shared.yaml: [finite]\n  base.yaml: [from_base]\n")
    specs["main.yaml"] = main.replace(bad_checks, "[positive, finite, from_base]")
    tree = make_tree(tmp_path, specs)
    result = build(tree["specs"], tree["templates"])
    (op,) = result.ops
    assert [(c.name, c.loc.file) for c in op.spec.checks] == [
        ("positive", "op_specs/main.yaml"),
        ("finite", "op_specs/shared.yaml"),
        ("from_base", "op_specs/base.yaml"),
    ]
    stubs = result.plan["ops/toy.py"]
    assert "def _check_finite(op, scale):" in stubs
    assert 'raise rt.ArgumentError(op, "scale", f"must be finite, got {scale}")' in stubs
    assert "    _check_from_base(op, scale)\n" in stubs
