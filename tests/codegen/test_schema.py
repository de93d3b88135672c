"""PyTorch schema strings: accepted forms and errors with columns."""

from __future__ import annotations

import pytest

from codegen.schema import SchemaError, parse_schema

GOOD = [
    (
        "name(Tensor input, float scale, int[] kernel_size, Tensor? bias, *, ScalarType? out_dtype=None) -> (Tensor, Tensor)",
        [("input", "Tensor", None, False), ("scale", "float", None, False), ("kernel_size", "int[]", None, False),
         ("bias", "Tensor?", None, False), ("out_dtype", "ScalarType?", "None", True)],
        ("Tensor", "Tensor"),
    ),
    ("f(Tensor(a!) x, int[2] k=[1, 1], bool b=False) -> Tensor",
     [("x", "Tensor", None, False), ("k", "int[2]", "(1, 1)", False), ("b", "bool", "False", False)], ("Tensor",)),
    ("g() -> ()", [], ()),
    ("h(Tensor x, str mode=\"mean\", float eps=1e-05) -> (Tensor out, Tensor idx)",
     [("x", "Tensor", None, False), ("mode", "str", "'mean'", False), ("eps", "float", "1e-05", False)],
     ("Tensor", "Tensor")),
]


@pytest.mark.parametrize("text,args,returns", GOOD)
def test_parses(text, args, returns):
    s = parse_schema(text)
    assert [(a.name, a.type, a.default, a.kw_only) for a in s.args] == args
    assert s.returns == returns
    assert s.name == text.split("(")[0]


BAD = [
    ("f(Tensor x", 10, "expected ',' or ')'"),
    ("f(Tensr x) -> Tensor", 2, "expected a type"),
    ("f(Tensor x) -> int", 15, "ops return tensors only"),
    ("f(Tensor x) Tensor", 12, "expected '->'"),
    ("f(Tensor x, int x) -> Tensor", 16, "duplicate argument"),
    ("f(Tensor stream) -> Tensor", 9, "reserved"),
    ("f(int a=1, int b) -> Tensor", 15, "without a default"),
    ("f(Tensor x, int k=foo) -> Tensor", 18, "unsupported default"),
    ("f(Tensor x) -> Tensor, Tensor", 21, "unexpected"),
    ("f(Tensor x; int y) -> Tensor", 10, "unexpected character"),
]


@pytest.mark.parametrize("text,col,message", BAD)
def test_errors_have_columns(text, col, message):
    with pytest.raises(SchemaError) as info:
        parse_schema(text)
    assert message in info.value.message
    assert info.value.col == col
