"""Strict schema tables for op spec files, and the parser from YAML nodes to the model.

The tables (in `spec_tables.py`, re-exported here) list the keys of each kind
of mapping (key, type, default, doc, required). `parse_family` checks every
mapping against its table (unknown keys come with the allowed set and a "did
you mean"), every value against its type,
and builds `model.FamilySpec`. A file's named checks and imports are read first
(`parse_checks`, joined across files by `imports.py`), so that `parse_family`
resolves an op's check names against the file's own checks and those it
imports. Only this module sees raw YAML nodes; it does no cross-checking
between shaders and ops (that is `validate.py`). Called by `build.py`;
`docs.py` renders the tables into codegen/README.md.
"""

from __future__ import annotations

from codegen.errors import Location, SpecError, did_you_mean
from codegen.model import (
    Axis,
    Binding,
    Check,
    CheckImport,
    CheckTable,
    FamilySpec,
    Named,
    OpSpec,
    Output,
    Override,
    PushConstant,
    Route,
    Scratch,
    ShaderSpec,
    SpecConstant,
    StepSpec,
)
from codegen.schema import SchemaError, parse_schema
from codegen.spec_nodes import (
    AXIS_RE,
    EXTENSION_RE,
    IDENT_RE,
    LOWER_RE,
    REFERENCE_RE,
    NodeChecker,
    kind_name,
)
from codegen.spec_tables import (  # noqa: F401  (re-exported: spec.TABLES etc.)
    ACCESS,
    BINDING,
    CHECK,
    DISPATCH,
    DTYPES,
    FAMILY,
    IMAGE_STORAGES,
    OP,
    OUTPUT,
    OVERRIDE,
    PUSH_CONSTANT,
    PUSH_TYPES,
    REQUIRED,
    ROUTE,
    SCRATCH,
    SHADER,
    SPEC_CONSTANT,
    SPEC_TYPES,
    STEP,
    STORAGES,
    TABLES,
    Field,
)
from codegen.yaml_loader import Node

# Op keys that make up its one step when it has no `steps` list.
SINGLE_STEP_KEYS = ("shader", "fixed", "select", "spec", "bind", "push", "dispatch")


class _Parser(NodeChecker):
    """Builds the model of one family file."""

    def check_table(self, root: Node) -> CheckTable:
        """The file's `checks` and `imports` (nothing if the root is not a mapping: `family`
        reports that)."""
        section = root.value if root.kind == "map" else {}
        checks = {}
        checks_node = section.get("checks")
        for cname, cnode in self.mapping(checks_node, "checks").items():
            self.key_name(checks_node, cname, "a check name")
            checks[cname] = self.check(cnode, cname, f"check '{cname}'")
        imports = []
        imports_node = section.get("imports")
        for file, names_node in self.mapping(imports_node, "imports").items():
            what = f"the checks imported from {file}"
            names = tuple(
                (n.value, n.loc)
                for n in self.seq(names_node, what)
                if self.want(n, "str", f"a check of {what}", "a check name")
            )
            imports.append(CheckImport(file, imports_node.key_locs[file], names))
        return CheckTable(self.path, checks, tuple(imports))

    def family(self, root: Node, checks: dict[str, Check | None]) -> FamilySpec | None:
        f = self.fields(root, FAMILY, "the family file", partial=True)
        if f is None:
            return None
        name = (
            self.ident(f["family"], "family", LOWER_RE, "a lower_case name")
            if "family" in f
            else ""
        )
        shaders = []
        shaders_node = f.get("shaders")
        for sname, snode in self.mapping(shaders_node, "shaders").items():
            if self.key_name(shaders_node, sname, "a shader name", LOWER_RE, "a lower_case name"):
                s = self.shader(snode, sname, name, shaders_node.key_locs[sname])
                if s:
                    shaders.append(s)
        ops = []
        ops_node = f.get("ops")
        for oname, onode in self.mapping(ops_node, "ops").items():
            if self.key_name(ops_node, oname, "an op name", LOWER_RE, "a lower_case name"):
                o = self.op(onode, oname, name, ops_node.key_locs[oname], checks)
                if o:
                    ops.append(o)
        doc = self.string(f.get("doc"), "family doc")
        return FamilySpec(name, doc, self.path, tuple(shaders), tuple(ops), root.loc)

    def check(self, node: Node, name: str, what: str) -> Check | None:
        f = self.fields(node, CHECK, what)
        if f is None:
            return None
        arg = self.ident(f["arg"], f"'arg' of {what}")
        expr = self.expr(f["expr"], f"'expr' of {what}")
        if not self.want(f["error"], "str", f"'error' of {what}", "a string (an f-string body)"):
            return None
        error = self.expr(f["error"], f"'error' of {what}")
        if expr is None or error is None:
            return None
        return Check(name, arg, expr, error, node.loc, f["arg"].loc)

    def shader(self, node: Node, name: str, family: str, loc: Location) -> ShaderSpec | None:
        what = f"shader '{name}'"
        f = self.fields(node, SHADER, what)
        if f is None:
            return None
        requires = self.seq(f.get("requires"), "requires")
        extensions = self.extensions(f.get("extensions"))
        template_node = f["template"]
        return ShaderSpec(
            name,
            family,
            self.string(f.get("doc"), "shader doc"),
            self.string(template_node, f"'template' of {what}"),
            template_node.loc,
            self.axes(f.get("axes"), what),
            self.axis_match_list(f.get("combos"), "combos", f"a combo of {what}"),
            self.axis_match_list(f.get("exclude"), "exclude", f"an exclude of {what}"),
            self.each(f.get("overrides"), "overrides", self.override, what),
            self.workgroup(f.get("workgroup"), f"'workgroup' of {what}", (64, 1, 1)),
            self.each(f.get("bindings"), "bindings", self.binding, what),
            self.each(f.get("push_constants"), "push_constants", self.push_constant, what),
            self.each(f.get("spec_constants"), "spec_constants", self.spec_constant, what),
            tuple(self.string(r, "a capability") for r in requires),
            tuple(r.loc for r in requires),
            extensions,
            loc,
        )

    def extensions(self, node: Node | None) -> tuple[str, ...]:
        return tuple(
            self.ident(e, "an extension", EXTENSION_RE, "a GL_* extension name")
            for e in self.seq(node, "extensions")
        )

    def each(self, node: Node | None, key: str, parse, what: str) -> tuple:
        """`parse(item, what)` of every item of the list under `key`, failures left out."""
        return tuple(x for x in (parse(i, what) for i in self.seq(node, key)) if x is not None)

    def axes(self, node: Node | None, what: str) -> tuple[Axis, ...]:
        axes = []
        for axis, vnode in self.mapping(node, f"axes of {what}").items():
            if not self.key_name(node, axis, "an axis name", AXIS_RE, "an UPPER_CASE name"):
                continue
            if vnode.kind != "seq" or not vnode.value:
                self.err(vnode.loc, f"axis {axis} of {what} must be a non-empty list of values")
                continue
            values = [self.axis_value(v, f"a value of axis {axis}") for v in vnode.value]
            if None in values:
                continue
            dup = {v for v in values if values.count(v) > 1}
            if dup:
                self.err(vnode.loc, f"axis {axis} lists {sorted(dup)[0]!r} twice")
            axes.append(Axis(axis, tuple(dict.fromkeys(values)), node.key_locs[axis]))
        return tuple(axes)

    def axis_match_list(self, node: Node | None, key: str, what: str):
        return tuple(self.axis_matches(entry, what) for entry in self.seq(node, key))

    def override(self, node: Node, what: str) -> Override | None:
        f = self.fields(node, OVERRIDE, f"an override of {what}")
        if f is None:
            return None
        specs = {}
        for sc, v in self.mapping(f.get("spec_constants"), "spec_constants").items():
            if self.want(v, "scalar", f"spec constant {sc}", "a scalar"):
                specs[sc] = (v.value, v.loc)
        requires = self.seq(f.get("requires"), "requires")
        return Override(
            self.axis_matches(f["when"], f"'when' of an override of {what}"),
            self.workgroup(f.get("workgroup"), "override workgroup", None),
            specs,
            tuple(self.string(r, "a capability") for r in requires),
            tuple(r.loc for r in requires),
            self.extensions(f.get("extensions")),
            node.loc,
        )

    def binding(self, node: Node, what: str) -> Binding | None:
        f = self.fields(node, BINDING, f"a binding of {what}")
        if f is None:
            return None
        vec_node = f.get("vec")
        vec = 4
        if vec_node is not None:
            if (
                vec_node.kind == "scalar"
                and type(vec_node.value) is int
                and vec_node.value in (1, 4)
            ):
                vec = vec_node.value
            else:
                self.err(
                    vec_node.loc,
                    f"'vec' of a binding of {what} must be 4 or 1, got {kind_name(vec_node)}",
                )
        return Binding(
            self.ident(f["name"], "binding name"),
            self.choice(f["dtype"], "binding dtype", DTYPES, "float32", axis_ok=True),
            self.choice(f.get("storage"), "binding storage", STORAGES, "buffer", axis_ok=True),
            vec,
            self.choice(f.get("access"), "binding access", ACCESS, "read"),
            self.boolean(f.get("wide"), f"'wide' of a binding of {what}"),
            self.axis_matches(f.get("when"), f"'when' of binding {f['name'].value}"),
            node.loc,
        )

    def push_constant(self, node: Node, what: str) -> PushConstant | None:
        f = self.fields(node, PUSH_CONSTANT, f"a push constant of {what}")
        if f is None:
            return None
        return PushConstant(
            self.ident(f["name"], "push constant name"),
            self.choice(f["type"], "push constant type", PUSH_TYPES, "uint"),
            self.axis_matches(f.get("when"), "'when' of a push constant"),
            node.loc,
        )

    def spec_constant(self, node: Node, what: str) -> SpecConstant | None:
        f = self.fields(node, SPEC_CONSTANT, f"a spec constant of {what}")
        if f is None or not self.want(f["default"], "scalar", "spec constant default", "a scalar"):
            return None
        return SpecConstant(
            self.ident(f["name"], "spec constant name"),
            self.choice(f["type"], "spec constant type", SPEC_TYPES, "int"),
            f["default"].value,
            node.loc,
            f["default"].loc,
        )

    def named(self, node: Node | None, what: str, key_pattern=IDENT_RE, expected="an identifier"):
        out = []
        for key, value in self.mapping(node, what).items():
            self.key_name(node, key, f"a key of {what}", key_pattern, expected)
            e = self.expr(value, f"{what}.{key}")
            if e is not None:
                out.append(Named(key, e, node.key_locs[key]))
        return tuple(out)

    def op(self, node: Node, name: str, family: str, loc: Location, checks) -> OpSpec | None:
        what = f"op '{name}'"
        f = self.fields(node, OP, what)
        if f is None:
            return None
        schema_expr = self.expr(f["schema"], f"'schema' of {what}")
        schema = None
        if schema_expr is not None:
            try:
                schema = parse_schema(schema_expr.text)
            except SchemaError as e:
                self.err(
                    schema_expr.at(1, e.col),
                    f"bad schema: {e.message}; expected e.g. "
                    "'name(Tensor input, float scale, *, ScalarType? dtype=None) -> Tensor'",
                )
            if schema is not None and schema.name != name:
                self.err(
                    schema_expr.at(1, 0),
                    f"schema name '{schema.name}' must equal the op key '{name}'",
                )
        ref = self.string(f["reference"], "reference")
        if ref and not REFERENCE_RE.match(ref):
            self.err(f["reference"].loc, f"reference must be 'module:function', got {ref!r}")
        op_checks = []
        for c in _flatten(self.seq(f.get("checks"), f"checks of {what}")):
            if c.kind == "scalar" and isinstance(c.value, str):
                if c.value not in checks:
                    self.err(
                        c.loc,
                        f"unknown check '{c.value}'{did_you_mean(c.value, checks)}; checks "
                        f"defined or imported in this file: {', '.join(checks) or '(none)'}",
                    )
                elif checks[c.value] is not None:
                    op_checks.append(checks[c.value])
            elif c.kind == "map":
                chk = self.check(c, "", f"an inline check of {what}")
                if chk:
                    op_checks.append(chk)
            else:
                self.err(
                    c.loc,
                    f"a check of {what} must be a check name, a mapping with arg, expr, error, "
                    "or a list of those",
                )
        outputs = self.outputs(f.get("outputs"), f"an output of {what}")
        scratch = [
            Scratch(n, shape, dtype, loc)
            for n, shape, dtype, loc in self.tensors(f.get("scratch"), SCRATCH, f"a scratch of {what}")
        ]
        single = [k for k in SINGLE_STEP_KEYS if k in f]
        steps, routes = [], []
        if "routes" in f:
            others = [k for k in ("steps", *single) if k in f]
            if others:
                self.err(
                    node.key_locs[others[0]],
                    f"{what} has `routes`, so it dispatches nothing itself; remove '{others[0]}'",
                )
            routes = self.each(f["routes"], "routes", self.route, what)
            if not routes:
                self.err(f["routes"].loc, f"`routes` of {what} must list at least one route")
        elif "steps" in f:
            if single:
                self.err(
                    node.key_locs[single[0]],
                    f"{what} has `steps`; move '{single[0]}' into a step",
                )
            steps = self.each(f["steps"], "steps", self.step, what)
            if not steps:
                self.err(f["steps"].loc, f"`steps` of {what} must list at least one step")
        else:
            missing = [k for k in ("shader", "dispatch") if k not in f]
            if missing:
                self.err(
                    node.loc,
                    f"{what} is missing the required key '{missing[0]}' (an op needs `shader` "
                    "and `dispatch`, or `steps`, or `routes`)",
                )
            else:
                step = self.step_fields(f, what, node)
                steps = [step] if step else []
        return OpSpec(
            name,
            family,
            self.string(f.get("doc"), "op doc"),
            schema,
            schema_expr,
            ref,
            f["reference"].loc,
            self.named(f.get("let"), "let"),
            tuple(op_checks),
            tuple(outputs),
            tuple(scratch),
            self.named(f.get("layouts"), "layouts"),
            tuple(steps),
            tuple(routes),
            loc,
        )

    def outputs(self, node: Node | None, what: str) -> list[Output]:
        """Each entry of an outputs list: `shape` and `dtype`, or `alias` alone."""
        out = []
        for o in self.seq(node, what):
            of = self.fields(o, OUTPUT, what)
            if of is None:
                continue
            name = self.ident(of["name"], "name")
            if "alias" in of:
                extra = [k for k in ("shape", "dtype") if k in of]
                if extra:
                    self.err(
                        o.key_locs[extra[0]],
                        f"{what} has `alias`, so its shape and dtype are the argument's; "
                        f"remove '{extra[0]}'",
                    )
                    continue
                out.append(Output(name, None, None, o.loc, self.ident(of["alias"], "alias"),
                                  of["alias"].loc))
                continue
            missing = [k for k in ("shape", "dtype") if k not in of]
            if missing:
                self.err(
                    o.loc,
                    f"{what} is missing the required key '{missing[0]}' (an output needs "
                    "`shape` and `dtype`, or `alias`)",
                )
                continue
            shape, dtype = self.expr(of["shape"], "shape"), self.expr(of["dtype"], "dtype")
            if shape and dtype:
                out.append(Output(name, shape, dtype, o.loc))
        return out

    def tensors(self, node: Node | None, table, what: str):
        """(name, shape, dtype, location) of each entry of a scratch list."""
        out = []
        for o in self.seq(node, what):
            of = self.fields(o, table, what)
            if of is None:
                continue
            shape, dtype = self.expr(of["shape"], "shape"), self.expr(of["dtype"], "dtype")
            if shape and dtype:
                out.append((self.ident(of["name"], "name"), shape, dtype, o.loc))
        return out

    def step(self, node: Node, what: str) -> StepSpec | None:
        f = self.fields(node, STEP, f"a step of {what}")
        return None if f is None else self.step_fields(f, f"a step of {what}", node)

    def step_fields(self, f: dict[str, Node], what: str, node: Node) -> StepSpec | None:
        """The step made of the step keys of `f` (a step, or an op in single-step form)."""
        kind, dispatch = "global", None
        df = self.fields(f["dispatch"], DISPATCH, f"'dispatch' of {what}")
        if df is not None:
            if len(df) != 1:
                self.err(
                    f["dispatch"].loc,
                    f"'dispatch' of {what} needs exactly one of 'global' or 'groups'",
                )
            else:
                kind = next(iter(df))
                dispatch = self.expr(df[kind], f"dispatch {kind}")
        bind_node, push_node = f.get("bind"), f.get("push")
        return StepSpec(
            self.ident(f["shader"], "shader"),
            f["shader"].loc,
            self.axis_matches(f.get("fixed"), f"'fixed' of {what}"),
            self.named(f.get("select"), "select", AXIS_RE, "an UPPER_CASE axis name"),
            self.named(f.get("spec"), "spec"),
            self.named(f.get("bind"), "bind"),
            self.named(f.get("push"), "push"),
            kind,
            dispatch,
            node.loc,
            bind_node.loc if bind_node else node.loc,
            push_node.loc if push_node else node.loc,
        )

    def route(self, node: Node, what: str) -> Route | None:
        f = self.fields(node, ROUTE, f"a route of {what}")
        if f is None:
            return None
        when = self.expr(f["when"], "route when") if "when" in f else None
        return Route(when, self.ident(f["op"], "route op"), node.loc, f["op"].loc)


def parse_checks(root: Node, path: str) -> tuple[CheckTable, list[SpecError]]:
    """A spec file's own named checks and its imports (`imports.resolve_imports` joins the
    files' tables); returns (table, errors)."""
    parser = _Parser(path)
    return parser.check_table(root), parser.errors


def parse_family(
    root: Node, path: str, checks: dict[str, Check | None] | None = None
) -> tuple[FamilySpec | None, list[SpecError]]:
    """Builds the family model from a composed YAML tree; returns (family or None, errors).

    `checks` are the names its ops may list: `imports.resolve_imports`'s table for the file
    (its own checks and those it imports). Left out, the file stands alone: its own checks
    (parsed here, errors included), its imports unresolved.
    """
    parser = _Parser(path)
    if checks is None:
        checks = parser.check_table(root).checks
    family = parser.family(root, checks)
    return family, parser.errors


def _flatten(nodes: list[Node]) -> list[Node]:
    """`nodes` with every sequence node replaced by its items, recursively: so an op's checks
    may hold a YAML alias of another op's list (``checks: [*common, extra]``)."""
    flat = []
    for node in nodes:
        flat.extend(_flatten(node.value) if node.kind == "seq" else [node])
    return flat
