"""Expressions: helper rewrite, name checks with columns, f-strings, tables kept in sync."""

from __future__ import annotations

import pytest

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
    """codegen's helper list is what runtime/ops/stub_support.py implements (importing it opens no device)."""
    from runtime.ops.stub_support import HELPERS as RUNTIME_HELPERS

    assert set(RUNTIME_HELPERS) == set(HELPERS)


def test_capabilities():
    """codegen's list of what a shader may require is the runtime's (they meet only in files)."""
    from runtime.vulkan.device import CAPABILITY_NAMES

    assert "integer_dot_product" in CAPABILITIES
    assert len(set(CAPABILITIES)) == len(CAPABILITIES) and set(CAPABILITIES) == set(CAPABILITY_NAMES)
