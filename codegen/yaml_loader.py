"""Compose YAML into nodes that keep their source location.

`load_yaml(text, display_path)` returns a tree of `Node`s: a mapping node
holds an ordered `dict[str, Node]` (plus the location of every key), a
sequence node a `list[Node]`, a scalar node the plain Python value (str, int,
float, bool or None). Duplicate keys, non-string keys and YAML syntax errors
become `SpecError`s. This module must not know the spec schema (that is
`spec.py`, the only caller).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml
from yaml.constructor import SafeConstructor

from codegen.errors import Location, SpecError

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_constructor = SafeConstructor()


@dataclass
class Node:
    """A YAML value with its location; `kind` is 'map', 'seq' or 'scalar'."""

    kind: str
    value: object
    loc: Location
    style: str | None = None  # scalar style: None (plain), "'", '"', '|', '>'
    key_locs: dict[str, Location] = field(default_factory=dict)

    def python(self):
        """The plain Python value of this node (dicts, lists, scalars)."""
        if self.kind == "map":
            return {k: v.python() for k, v in self.value.items()}
        if self.kind == "seq":
            return [v.python() for v in self.value]
        return self.value


def _loc(mark, path: str) -> Location:
    return Location(path, mark.line + 1, mark.column + 1)


def _convert(node, path: str, errors: list[SpecError]) -> Node:
    loc = _loc(node.start_mark, path)
    if isinstance(node, yaml.MappingNode):
        items: dict[str, Node] = {}
        key_locs: dict[str, Location] = {}
        for key_node, value_node in node.value:
            key_loc = _loc(key_node.start_mark, path)
            if not isinstance(key_node, yaml.ScalarNode):
                errors.append(SpecError(key_loc, "expected a plain key, got a collection"))
                continue
            key = _constructor.construct_object(key_node)
            if key is None or isinstance(key, (dict, list)):
                errors.append(SpecError(key_loc, f"expected a key name, got {key!r}"))
                continue
            key = str(key) if not isinstance(key, bool) else str(key).lower()
            if key in items:
                first = key_locs[key]
                errors.append(
                    SpecError(
                        key_loc,
                        f"duplicate key '{key}' (first defined at line {first.line}); "
                        "remove one of them",
                    )
                )
                continue
            items[key] = _convert(value_node, path, errors)
            key_locs[key] = key_loc
        return Node("map", items, loc, key_locs=key_locs)
    if isinstance(node, yaml.SequenceNode):
        return Node("seq", [_convert(n, path, errors) for n in node.value], loc)
    value = _constructor.construct_object(node)
    return Node("scalar", value, loc, style=node.style)


def load_yaml(text: str, path: str) -> tuple[Node | None, list[SpecError]]:
    """Parses one YAML document; returns (root node or None, errors)."""
    errors: list[SpecError] = []
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        loc = _loc(mark, path) if mark else Location(path, 1, 1)
        problem = e.problem or e.context or "invalid YAML"
        context = f" {e.context}" if e.context and e.problem else ""
        errors.append(SpecError(loc, f"YAML syntax error: {problem}{context}"))
        return None, errors
    except yaml.YAMLError as e:  # pragma: no cover - unmarked errors are rare
        errors.append(SpecError(Location(path, 1, 1), f"YAML error: {e}"))
        return None, errors
    if root is None:
        return Node("map", {}, Location(path, 1, 1)), errors
    return _convert(root, path, errors), errors
