"""Typed, error-collecting accessors over YAML nodes: the vocabulary `spec.py` parses with.

`NodeChecker` checks a mapping against a schema table (unknown keys with the
allowed set and a "did you mean", missing required keys) and reads typed
values (strings, identifiers, expressions, axis values and matches,
workgroups, choices), recording a `SpecError` at the node's location for
every mismatch. Part of the spec layer: only `spec.py` uses it.
"""

from __future__ import annotations

import re

from codegen.errors import Location, SpecError, did_you_mean
from codegen.model import AxisMatch, Expr
from codegen.yaml_loader import Node

IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
LOWER_RE = re.compile(r"[a-z][a-z0-9_]*\Z")
AXIS_RE = re.compile(r"[A-Z][A-Z0-9_]*\Z")
REFERENCE_RE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")
EXTENSION_RE = re.compile(r"GL_\w+\Z")
_VALUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*\Z")
_AXIS_REF_RE = re.compile(r"\$\{[A-Z][A-Z0-9_]*\}\Z")


def kind_name(node: Node) -> str:
    """How a node's kind reads in a message: 'a list', 'an integer', "the string 'x'"."""
    if node.kind == "map":
        return "a mapping"
    if node.kind == "seq":
        return "a list"
    v = node.value
    return {bool: "a boolean", int: "an integer", float: "a number", type(None): "null"}.get(
        type(v), f"the string {v!r}" if isinstance(v, str) else type(v).__name__
    )


class NodeChecker:
    """Typed accessors over YAML nodes that record `SpecError`s instead of raising."""

    def __init__(self, path: str):
        self.path = path
        self.errors: list[SpecError] = []

    def err(self, loc: Location, msg: str) -> None:
        self.errors.append(SpecError(loc, msg))

    def fields(self, node: Node, table, what: str, partial: bool = False) -> dict[str, Node] | None:
        """The known keys of a mapping checked against `table` (unknown and missing keys
        are errors). Returns None if `node` is not a mapping or, unless `partial`, if a
        required key is missing (the caller cannot build its object)."""
        if node.kind != "map":
            self.err(node.loc, f"{what} must be a mapping, got {kind_name(node)}")
            return None
        allowed = [f.key for f in table]
        out = {}
        for key, value in node.value.items():
            if key not in allowed:
                self.err(
                    node.key_locs[key],
                    f"unknown key '{key}' in {what}{did_you_mean(key, allowed)}; "
                    f"allowed keys: {', '.join(allowed)}",
                )
                continue
            out[key] = value
        missing = [f for f in table if f.required and f.key not in out]
        for f in missing:
            self.err(
                node.loc, f"{what} is missing the required key '{f.key}' ({f.doc.rstrip('.')})"
            )
        return None if missing and not partial else out

    def want(self, node: Node, kind: str, what: str, expected: str) -> bool:
        ok = (
            node.kind == kind
            if kind != "str"
            else (node.kind == "scalar" and isinstance(node.value, str))
        )
        if not ok:
            self.err(node.loc, f"{what} must be {expected}, got {kind_name(node)}")
        return ok

    def string(self, node: Node | None, what: str, default: str = "") -> str:
        if node is None:
            return default
        return node.value if self.want(node, "str", what, "a string") else default

    def boolean(self, node: Node | None, what: str, default: bool = False) -> bool:
        if node is None:
            return default
        if node.kind != "scalar" or type(node.value) is not bool:
            self.err(node.loc, f"{what} must be true or false, got {kind_name(node)}")
            return default
        return node.value

    def ident(self, node: Node, what: str, pattern=IDENT_RE, expected="an identifier") -> str:
        if node.kind != "scalar" or not isinstance(node.value, str):
            self.err(node.loc, f"{what} must be {expected}, got {kind_name(node)}")
            return ""
        if not pattern.match(node.value):
            self.err(node.loc, f"{what} must be {expected}, got {node.value!r}")
        return node.value

    def key_name(self, node: Node, key: str, what: str, pattern=IDENT_RE, expected="an identifier"):
        if not pattern.match(key):
            self.err(node.key_locs[key], f"{what} must be {expected}, got {key!r}")
            return False
        return True

    def expr(self, node: Node | None, what: str) -> Expr | None:
        if node is None:
            return None
        if node.kind != "scalar" or node.value is None:
            self.err(
                node.loc, f"{what} must be a Python expression (a string), got {kind_name(node)}"
            )
            return None
        v = node.value
        text = v if isinstance(v, str) else repr(v)
        return Expr(text.strip(), node.loc, node.style)

    def seq(self, node: Node | None, what: str) -> list[Node]:
        if node is None:
            return []
        return list(node.value) if self.want(node, "seq", what, "a list") else []

    def mapping(self, node: Node | None, what: str) -> dict[str, Node]:
        if node is None:
            return {}
        return dict(node.value) if self.want(node, "map", what, "a mapping") else {}

    def axis_value(self, node: Node, what: str) -> str | None:
        v = node.value
        if node.kind != "scalar" or v is None or isinstance(v, float):
            self.err(
                node.loc,
                f"{what} must be an axis value (a name or integer), got {kind_name(node)}",
            )
            return None
        text = str(v).lower() if isinstance(v, bool) else str(v)
        if not _VALUE_RE.match(text):
            self.err(
                node.loc, f"{what} must be a name made of letters, digits and '_', got {text!r}"
            )
            return None
        return text

    def axis_matches(self, node: Node | None, what: str) -> tuple[AxisMatch, ...]:
        out = []
        for axis, value in self.mapping(node, what).items():
            items = value.value if value.kind == "seq" else [value]
            values = [self.axis_value(v, f"value of {axis} in {what}") for v in items]
            if not items:
                self.err(value.loc, f"{axis} in {what} lists no values")
            if all(v is not None for v in values):
                out.append(AxisMatch(axis, tuple(values), node.key_locs[axis], value.loc))
        return tuple(out)

    def workgroup(self, node: Node | None, what: str, default):
        if node is None:
            return default
        items = node.value if node.kind == "seq" else None
        if (
            not items
            or len(items) != 3
            or not all(i.kind == "scalar" and type(i.value) is int and i.value > 0 for i in items)
        ):
            self.err(node.loc, f"{what} must be a list of 3 positive integers, e.g. [64, 1, 1]")
            return default
        return tuple(i.value for i in items)

    def choice(self, node: Node | None, what: str, choices, default, axis_ok=False) -> str:
        if node is None:
            return default
        if not self.want(node, "str", what, f"one of {', '.join(choices)}"):
            return default
        v = node.value
        if v in choices or (axis_ok and _AXIS_REF_RE.match(v)):
            return v
        extra = " or ${AXIS}" if axis_ok else ""
        self.err(
            node.loc,
            f"{what} must be one of {', '.join(choices)}{extra}, got {v!r}"
            f"{did_you_mean(v, choices)}",
        )
        return default
