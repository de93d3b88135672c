"""Expressions: helper rewrite, name checks with columns, f-strings, tables kept in sync."""

from __future__ import annotations

import ast

import pytest
from codegen_testlib import REPO

from codegen.errors import Location
from codegen.expressions import CAPABILITIES, HELPERS, rewrite, rewrite_fstring
from codegen.model import Expr

LOC = Location("s.yaml", 7, 11)


def expr(text, style=None):
    return Expr(text, LOC, style)


REWRITES = [
    ("numel(input)", "rt.numel(input)"),
    ("[tokens(input), 1, 1]", "[rt.tokens(input), 1, 1]"),
    ("torch.float32 if out_dtype is None else out_dtype", "torch.float32 if out_dtype is None else out_dtype"),
    ("math.isfinite(scale) and scale > 0", "math.isfinite(scale) and scale > 0"),
    ("all(d > 0 for d in input.shape)", "all((d > 0 for d in input.shape))"),
    ("max(ceil_div(numel(input), 4), 1)", "max(rt.ceil_div(rt.numel(input), 4), 1)"),
]


@pytest.mark.parametrize("text,code", REWRITES)
def test_rewrite(text, code):
    errors = []
    r = rewrite(expr(text), {"input", "scale", "out_dtype"}, "x", errors)
    assert not errors
    assert r.code == code


def test_names_in_source_order_and_modules():
    r = rewrite(expr("dtype if x is None else torch.int8"), {"x", "dtype"}, "x", [])
    assert r.names == ["dtype", "x", "torch"]
    assert r.modules == {"torch"}


@pytest.mark.parametrize(
    "text,style,col,message",
    [
        ("numel(inpt)", None, 17, "unknown name 'inpt' (did you mean 'input'?)"),
        ("numel(inpt)", '"', 18, "unknown name 'inpt'"),
        ("numel(input))", None, 23, "unmatched ')'"),
        ("scale >", None, 18, "invalid syntax"),
        ("f(x y)", None, 13, "invalid syntax"),
    ],
)
def test_errors_point_into_the_scalar(text, style, col, message):
    errors = []
    assert rewrite(expr(text, style), {"input", "scale"}, "push x", errors) is None
    assert errors[0].location == Location("s.yaml", 7, col)
    assert message in errors[0].message


def test_fstring():
    errors = []
    r = rewrite_fstring(expr('got {tuple(x.shape)} and {numel(x)!r:>4} "q" {{lit}}'), {"x"}, "e", errors)
    assert not errors
    assert r.code == 'f"got {tuple(x.shape)} and {rt.numel(x)!r:>4} \\"q\\" {{lit}}"'
    plain = rewrite_fstring(expr("no fields {{here}}"), set(), "e", [])
    assert plain.code == '"no fields {here}"'


def test_fstring_unknown_name_column():
    errors = []
    rewrite_fstring(expr("bad {y}"), {"x"}, "e", errors)
    assert errors[0].location == Location("s.yaml", 7, 16)


def test_helpers_match_runtime():
    """runtime/stub_support.py's HELPERS (read statically: importing it needs a device)."""
    path = REPO / "runtime" / "stub_support.py"
    if not path.exists():
        pytest.skip("runtime/stub_support.py not written yet")
    tree = ast.parse(path.read_text())
    names = None
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "HELPERS":
            names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in HELPERS or
                     (isinstance(n, ast.Name) and isinstance(getattr(n, "ctx", None), ast.Load))}
            names = {n for n in names if n not in ("f", "dict", "str", "Callable", "Any")}
    assert names == set(HELPERS)


def test_capabilities():
    assert "integer_dot_product" in CAPABILITIES
    assert len(set(CAPABILITIES)) == len(CAPABILITIES) == 9
