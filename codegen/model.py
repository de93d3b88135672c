"""The spec model: frozen dataclasses that every stage after `spec.py` works on.

Every entry keeps the `Location` it came from so later stages can report
errors at the YAML line. Dicts inside these objects are treated as read-only.
This module holds data only: no parsing, no validation, no rendering.
Created by `spec.py` (specs), `variants.py` (variants), `interface.py`
(interfaces) and `validate.py` (resolved ops); read by everything downstream.
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.errors import Location


@dataclass(frozen=True)
class Expr:
    """A Python expression from the spec; `at(line, col)` locates a character in it."""

    text: str
    loc: Location  # where the YAML scalar starts
    style: str | None = None  # YAML scalar style: None (plain), "'", '"', "|", ">"

    def at(self, lineno: int = 1, col_offset: int = 0) -> Location:
        """Location of (1-based line, 0-based column) inside the expression text."""
        if self.style in ("|", ">"):
            return Location(self.loc.file, self.loc.line + lineno, col_offset + 1)
        if lineno == 1:
            base = self.loc.col + (1 if self.style in ("'", '"') else 0)
            return Location(self.loc.file, self.loc.line, base + col_offset)
        return Location(self.loc.file, self.loc.line + lineno - 1, col_offset + 1)


@dataclass(frozen=True)
class AxisMatch:
    """`AXIS: value | [values]` inside fixed/when/exclude/combos, with locations."""

    axis: str
    values: tuple[str, ...]
    loc: Location  # of the axis key
    value_loc: Location


@dataclass(frozen=True)
class Axis:
    name: str
    values: tuple[str, ...]
    loc: Location


@dataclass(frozen=True)
class Check:
    name: str  # "" for an inline check
    arg: str
    expr: Expr
    error: Expr  # an f-string body
    loc: Location
    arg_loc: Location


@dataclass(frozen=True)
class CheckImport:
    """One entry of a spec file's `imports`: checks that another spec file defines."""

    file: str  # a spec file of the same folder, e.g. q8ta_unary.yaml
    loc: Location  # of the file's key
    names: tuple[tuple[str, Location], ...]  # (check name, where it is listed)


@dataclass(frozen=True)
class CheckTable:
    """A spec file's own named checks (None: one that failed to parse) and its imports."""

    file: str  # display path, e.g. op_specs/q8ta_binary.yaml
    checks: dict[str, Check | None]
    imports: tuple[CheckImport, ...]


@dataclass(frozen=True)
class Binding:
    name: str
    dtype: str  # may contain ${AXIS}
    storage: str  # may contain ${AXIS}
    vec: int
    access: str
    wide: bool  # also a 16-byte view (int8/uint8 buffers)
    when: tuple[AxisMatch, ...]
    loc: Location


@dataclass(frozen=True)
class PushConstant:
    name: str
    type: str
    when: tuple[AxisMatch, ...]
    loc: Location


@dataclass(frozen=True)
class SpecConstant:
    name: str
    type: str
    default: object
    loc: Location
    default_loc: Location


@dataclass(frozen=True)
class Override:
    when: tuple[AxisMatch, ...]
    workgroup: tuple[int, int, int] | None
    spec_constants: dict[str, tuple[object, Location]]  # name -> (value, location)
    requires: tuple[str, ...]
    requires_locs: tuple[Location, ...]
    extensions: tuple[str, ...]
    loc: Location


@dataclass(frozen=True)
class ShaderSpec:
    name: str
    family: str
    doc: str
    template: str
    template_loc: Location
    axes: tuple[Axis, ...]
    combos: tuple[tuple[AxisMatch, ...], ...]
    exclude: tuple[tuple[AxisMatch, ...], ...]
    overrides: tuple[Override, ...]
    workgroup: tuple[int, int, int]
    bindings: tuple[Binding, ...]
    push_constants: tuple[PushConstant, ...]
    spec_constants: tuple[SpecConstant, ...]
    requires: tuple[str, ...]
    requires_locs: tuple[Location, ...]
    extensions: tuple[str, ...]
    loc: Location

    def axis(self, name: str) -> Axis | None:
        return next((a for a in self.axes if a.name == name), None)


@dataclass(frozen=True)
class SchemaArg:
    name: str
    type: str  # as written: "Tensor", "float", "ScalarType?", "int[]"
    default: str | None  # Python source of the default, or None
    kw_only: bool

    @property
    def is_tensor(self) -> bool:
        return self.type.rstrip("?") == "Tensor"


@dataclass(frozen=True)
class Schema:
    name: str
    args: tuple[SchemaArg, ...]
    returns: tuple[str, ...]
    text: str

    def arg(self, name: str) -> SchemaArg | None:
        return next((a for a in self.args if a.name == name), None)


@dataclass(frozen=True)
class Output:
    """An output tensor: allocated with `shape` and `dtype`, or, with `alias`, the device
    tensor of that Tensor argument, written in place (shape and dtype None)."""

    name: str
    shape: Expr | None
    dtype: Expr | None
    loc: Location
    alias: str = ""
    alias_loc: Location | None = None


@dataclass(frozen=True)
class Named:
    """`key: value` from a mapping (bind, push, let, select) with both locations."""

    key: str
    value: Expr
    loc: Location


@dataclass(frozen=True)
class Scratch:
    """A device temporary of an op: written by one step, read by a later one."""

    name: str
    shape: Expr
    dtype: Expr
    loc: Location


@dataclass(frozen=True)
class StepSpec:
    """One dispatch of an op: a shader's variant, its bindings, push constants and size."""

    shader: str
    shader_loc: Location
    fixed: tuple[AxisMatch, ...]
    select: tuple[Named, ...]
    spec: tuple[Named, ...]  # spec constant <- expression
    bind: tuple[Named, ...]
    push: tuple[Named, ...]
    dispatch_kind: str  # "global" or "groups"
    dispatch: Expr | None
    loc: Location
    bind_loc: Location
    push_loc: Location


@dataclass(frozen=True)
class Route:
    """`{when, op}`: the op a dispatcher op hands its arguments to when `when` holds."""

    when: Expr | None  # None: otherwise
    op: str
    loc: Location
    op_loc: Location


@dataclass(frozen=True)
class OpSpec:
    name: str
    family: str
    doc: str
    schema: Schema | None
    schema_expr: Expr
    reference: str
    reference_loc: Location
    lets: tuple[Named, ...]
    checks: tuple[Check, ...]  # named checks (the file's own or imported) resolved, inline ones as given
    outputs: tuple[Output, ...]
    scratch: tuple[Scratch, ...]
    layouts: tuple[Named, ...]  # tensor name <- packed layout expression
    steps: tuple[StepSpec, ...]  # one for the single-shader form; () for a dispatcher
    routes: tuple[Route, ...]
    loc: Location


@dataclass(frozen=True)
class FamilySpec:
    name: str
    doc: str
    file: str  # display path, e.g. op_specs/quantize.yaml
    shaders: tuple[ShaderSpec, ...]
    ops: tuple[OpSpec, ...]
    loc: Location


@dataclass(frozen=True)
class Variant:
    """One shader variant: a full assignment of axis values plus per-variant overrides."""

    name: str
    shader: ShaderSpec
    axes: dict[str, str]
    workgroup: tuple[int, int, int]
    spec_defaults: dict[str, object]
    requires: tuple[str, ...]  # the shader's, then those of matching overrides
    extensions: tuple[str, ...]  # likewise

    @property
    def loc(self) -> Location:
        return self.shader.loc


@dataclass(frozen=True)
class BindingSlot:
    name: str
    binding: int
    dtype: str
    storage: str
    vec: int
    access: str
    descriptor: str  # "storage_buffer" or "storage_image"
    format: str | None  # image format for texture3d
    wide: bool = False  # also NAME_load_word4 / NAME_store_word4 (a 16-byte view of an int8/uint8 buffer)


@dataclass(frozen=True)
class PushField:
    name: str
    type: str
    offset: int
    size: int


@dataclass(frozen=True)
class SpecConstantSlot:
    name: str
    id: int
    type: str
    default: object


@dataclass(frozen=True)
class Interface:
    """The ABI of one variant; renders GLSL declarations and the manifest entry."""

    workgroup: tuple[int, int, int]
    bindings: tuple[BindingSlot, ...]
    push_fields: tuple[PushField, ...]
    push_size: int
    spec_constants: tuple[SpecConstantSlot, ...]
    extensions: tuple[str, ...]
    requires: tuple[str, ...]


@dataclass(frozen=True)
class ResolvedStep:
    """One step of a resolved op, as stub code."""

    variants: tuple[Variant, ...]
    select: tuple[tuple[str, str | None, str], ...]  # (axis, arg name or None, code)
    bind: tuple[tuple[str, str, str], ...]  # (binding, name, kind: arg|let|output|scratch)
    push: tuple[tuple[str, str], ...]  # (name, code)
    spec: tuple[tuple[str, str], ...]  # (spec constant, code)
    dispatch: tuple[str, str]  # ("global_size" | "groups", code)
    conditional_push: bool  # some push constant is missing from some variant of the step


@dataclass(frozen=True)
class ResolvedOp:
    """An op checked against its shaders, with every expression rewritten to stub code."""

    spec: OpSpec
    key: str  # etvk.<op>.default
    variants: tuple[Variant, ...]  # of every step (or every route's op), in order
    # (check name or "" for an inline check, arg, condition code, f-string code,
    #  the schema arguments the check reads: its arg, then in order of appearance)
    checks: tuple[tuple[str, str, str, str, tuple[str, ...]], ...]
    lets: tuple[tuple[str, str], ...]  # (name, code)
    outputs: tuple[tuple[str, str, str], ...]  # (name, shape code, dtype code)
    aliases: tuple[tuple[str, str], ...]  # (output name, the Tensor argument it is)
    scratch: tuple[tuple[str, str, str], ...]  # (name, shape code, dtype code)
    layouts: tuple[tuple[str, str], ...]  # (tensor name, layout code)
    steps: tuple[ResolvedStep, ...]
    routes: tuple[tuple[str | None, str], ...]  # (condition code or None, op name)
    fake_lets: tuple[tuple[str, str], ...]  # the lets the fake function needs
    modules: tuple[str, ...]  # modules the stub code uses ("math", "torch")
