"""Parse PyTorch operator schema strings into `model.Schema`.

Grammar (the subset the toolkit needs):
`name(TYPE arg[=default], ..., *, TYPE kwarg=default) -> RETURNS` where TYPE
is a base type (`Tensor`, `int`, `float`, `bool`, `str`, `ScalarType`,
`Scalar`, `SymInt`, `Layout`, `Device`, `MemoryFormat`) with optional `[]` /
`[N]` and `?` suffixes, and RETURNS is `Tensor`, `()` or `(Tensor, ...)`.
Own small parser: it must not import torch (generation must stay fast).
Called by `spec.py`; errors carry the 0-based column inside the schema text.
"""

from __future__ import annotations

import ast
import keyword
import re

from codegen.model import Schema, SchemaArg

BASE_TYPES = (
    "Tensor",
    "int",
    "float",
    "bool",
    "str",
    "ScalarType",
    "Scalar",
    "SymInt",
    "Layout",
    "Device",
    "MemoryFormat",
)
RESERVED = ("stream", "variant", "storage", "op", "v", "rt", "torch", "math")

_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_][A-Za-z_0-9.]*)|(?P<arrow>->)|(?P<num>-?\d+(?:\.\d*)?(?:e-?\d+)?)"
    r"|(?P<str>\"[^\"]*\"|'[^']*')|(?P<op>[(),\[\]=?*!|]))"
)


class SchemaError(Exception):
    """A schema string that does not parse; `col` is the 0-based offset in the text."""

    def __init__(self, message: str, col: int):
        super().__init__(message)
        self.message = message
        self.col = col


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            col = pos + len(text[pos:]) - len(text[pos:].lstrip())
            raise SchemaError(f"unexpected character {text[col]!r}", col)
        kind = m.lastgroup
        tokens.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(("end", "", len(text)))
    return tokens


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def next(self) -> tuple[str, str, int]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def expect(self, value: str, what: str) -> tuple[str, str, int]:
        tok = self.next()
        if tok[1] != value or tok[0] == "str":
            got = repr(tok[1]) if tok[0] != "end" else "the end"
            raise SchemaError(f"expected {what}, got {got}", tok[2])
        return tok

    def type(self) -> str:
        kind, value, col = self.next()
        if kind != "name" or value not in BASE_TYPES:
            got = repr(value) if kind != "end" else "the end"
            raise SchemaError(f"expected a type ({', '.join(BASE_TYPES)}), got {got}", col)
        text = value
        if self.peek()[1] == "(" and value == "Tensor":  # alias annotation: Tensor(a!)
            while self.next()[1] not in (")", ""):
                pass
        if self.peek()[1] == "[":
            self.next()
            size = ""
            if self.peek()[0] == "num":
                size = self.next()[1]
            self.expect("]", "']'")
            text += f"[{size}]"
        if self.peek()[1] == "?":
            self.next()
            text += "?"
        return text

    def default(self) -> str:
        start = self.peek()[2]
        depth = 0
        while True:
            kind, value, col = self.peek()
            if kind == "end" or (depth == 0 and value in (",", ")")):
                end = col
                break
            depth += value == "["
            depth -= value == "]"
            self.next()
        raw = self.text[start:end].strip()
        if not raw:
            raise SchemaError("expected a default value after '='", start)
        try:
            value = ast.literal_eval(raw.replace("true", "True").replace("false", "False"))
        except (ValueError, SyntaxError):
            raise SchemaError(
                f"unsupported default {raw!r}; use None, a number, a bool, a string or a list",
                start,
            ) from None
        if isinstance(value, list):
            value = tuple(value)
        return repr(value)

    def parse(self) -> Schema:
        kind, name, col = self.next()
        if kind != "name" or not name.isidentifier():
            raise SchemaError("expected the operator name", col)
        self.expect("(", "'(' after the operator name")
        args: list[SchemaArg] = []
        kw_only = False
        seen_default = False
        if self.peek()[1] == ")":
            self.next()
        else:
            while True:
                if self.peek()[1] == "*":
                    self.next()
                    kw_only = True
                else:
                    typ = self.type()
                    kind, arg, col = self.next()
                    if kind != "name" or not arg.isidentifier():
                        raise SchemaError("expected an argument name", col)
                    if keyword.iskeyword(arg) or arg in RESERVED:
                        raise SchemaError(
                            f"argument name '{arg}' is reserved in stubs; rename it", col
                        )
                    if any(a.name == arg for a in args):
                        raise SchemaError(f"duplicate argument '{arg}'", col)
                    default = None
                    if self.peek()[1] == "=":
                        self.next()
                        default = self.default()
                        seen_default = seen_default or not kw_only
                    elif seen_default and not kw_only:
                        raise SchemaError(
                            f"argument '{arg}' without a default follows one with a default", col
                        )
                    args.append(SchemaArg(arg, typ, default, kw_only))
                tok = self.next()
                if tok[1] == ")":
                    break
                if tok[1] != ",":
                    got = repr(tok[1]) if tok[0] != "end" else "the end"
                    raise SchemaError(f"expected ',' or ')', got {got}", tok[2])
        self.expect("->", "'->' and the return type")
        returns = self.returns()
        tok = self.peek()
        if tok[0] != "end":
            raise SchemaError(f"unexpected {tok[1]!r} after the return type", tok[2])
        return Schema(name, tuple(args), returns, self.text)

    def returns(self) -> tuple[str, ...]:
        if self.peek()[1] != "(":
            return (self._return(),)
        self.next()
        out = []
        if self.peek()[1] == ")":
            self.next()
            return ()
        while True:
            out.append(self._return())
            tok = self.next()
            if tok[1] == ")":
                return tuple(out)
            if tok[1] != ",":
                raise SchemaError("expected ',' or ')' in the return list", tok[2])

    def _return(self) -> str:
        col = self.peek()[2]
        typ = self.type()
        if self.peek()[0] == "name":  # a named return
            self.next()
        if typ != "Tensor":
            raise SchemaError(f"ops return tensors only, got {typ!r}", col)
        return typ


def parse_schema(text: str) -> Schema:
    """Parses a schema string; raises `SchemaError` (with a column) if it is malformed."""
    return _Parser(text).parse()
