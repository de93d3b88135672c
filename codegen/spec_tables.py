"""The schema tables of op spec files: every key of every mapping, with type, default and doc.

`spec.py` checks YAML against these tables and `docs.py` renders them into
codegen/README.md, so the accepted keys and the documentation cannot drift.
Data only: no parsing. Re-exported by `spec.py` (`spec.TABLES`, `spec.DTYPES`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Field:
    key: str
    type: str
    default: object
    doc: str
    required: bool = False


REQUIRED = object()

F = Field
FAMILY = (
    F("family", "identifier", REQUIRED, "Family name; names generated/ops/<family>.py.", True),
    F("doc", "string", "", "What the family computes."),
    F("imports", "mapping of spec file to check names", {}, "Named checks of other spec files of the folder that this file's ops list by name as their own: `{other.yaml: [name, ...]}`, each defined in that file's `checks` and not here; imports go one way (no cycle)."),
    F("checks", "mapping of name to check", {}, "Named argument checks that ops list by name (other spec files may import them)."),
    F("shaders", "mapping of name to shader", REQUIRED, "Shaders (one template each).", True),
    F("ops", "mapping of name to op", {}, "Ops; each key must equal its schema's name."),
)
CHECK = (
    F("arg", "identifier", REQUIRED, "The schema argument the error is about.", True),
    F("expr", "expression", REQUIRED, "Condition that must hold (torch tensors).", True),
    F("error", "f-string", REQUIRED, "Message body (f-string) when `expr` is false.", True),
)
SHADER = (
    F("doc", "string", "", "What one invocation computes."),
    F("template", "string", REQUIRED, "Jinja template file under templates/.", True),
    F("axes", "mapping of AXIS to values", {}, "Variant axes in order; first value preferred."),
    F("combos", "list of axis mappings", [], "Full axis assignments added after `exclude`."),
    F("exclude", "list of axis mappings", [], "Partial assignments; matching variants dropped."),
    F("overrides", "list of override", [], "Per-variant workgroup / spec-constant defaults."),
    F("workgroup", "list of 3 integers", [64, 1, 1], "Default workgroup size (spec ids 0-2)."),
    F("bindings", "list of binding", [], "Descriptor bindings, numbered in listing order."),
    F("push_constants", "list of push constant", [], "Push constants, std430 listing order."),
    F("spec_constants", "list of spec constant", [], "Specialization constants, ids from 3."),
    F("requires", "list of capabilities", [], "Device capabilities every variant needs."),
    F("extensions", "list of strings", [], "GLSL extensions enabled in the header."),
)
AXIS = (
    F("<AXIS>", "list of values", REQUIRED, "UPPER_CASE axis name -> its values; first preferred."),
)
BINDING = (
    F("name", "identifier", REQUIRED, "GLSL name; accessors are NAME_load / NAME_store.", True),
    F("dtype", "dtype", REQUIRED, "float32, float16, int32, int8, uint8 or ${AXIS}.", True),
    F("storage", "storage", "buffer", "buffer, texture3d or texture2d, or ${AXIS}."),
    F("vec", "integer", 4, "Values per unit: 4, or 1 (32-bit dtypes in buffers only)."),
    F("access", "access", "read", "read, write or read_write."),
    F("wide", "boolean", False, "int8/uint8 buffers: also NAME_load_word4(i) (read) and NAME_store_word4(i, uvec4) (written), words 4i..4i+3 as one 16-byte access."),
    F("when", "axis mapping", {}, "Only in variants whose axes match."),
)
PUSH_CONSTANT = (
    F("name", "identifier", REQUIRED, "Member of the `pc` block.", True),
    F("type", "push type", REQUIRED, "int, uint, float, ivec4, uvec4 or vec4.", True),
    F("when", "axis mapping", {}, "Only in variants whose axes match."),
)
SPEC_CONSTANT = (
    F("name", "identifier", REQUIRED, "GLSL constant name.", True),
    F("type", "spec type", REQUIRED, "int, uint, float or bool.", True),
    F("default", "scalar", REQUIRED, "Default value (overridable per variant).", True),
)
OVERRIDE = (
    F("when", "axis mapping", REQUIRED, "Variants this override applies to.", True),
    F("workgroup", "list of 3 integers", None, "Workgroup size for those variants."),
    F("spec_constants", "mapping of name to scalar", {}, "Spec-constant defaults for them."),
    F("requires", "list of capabilities", [], "Extra device capabilities those variants need."),
    F("extensions", "list of strings", [], "Extra GLSL extensions those variants enable."),
)
OP = (
    F("doc", "string", "", "What the op computes."),
    F("schema", "schema", REQUIRED, "PyTorch schema; its name must equal the op key.", True),
    F("reference", "module:function", REQUIRED, "PyTorch reference implementation.", True),
    F("let", "mapping of name to expression", {}, "Derived values, evaluated in order."),
    F("checks", "list of check names or checks", [],
      "Argument checks, in order; a nested list, e.g. the YAML alias of another op's "
      "(`[*common, extra]`), counts as its items in place."),
    F("outputs", "list of output", [], "Output tensors, in return order."),
    F("scratch", "list of scratch", [], "Device temporaries that steps pass to each other."),
    F("layouts", "mapping of name to expression", {}, "Tensor <- packed int8 layout it has."),
    F("shader", "identifier", None, "Single-step form: the shader the op dispatches."),
    F("fixed", "axis mapping", {}, "Single-step form: see step."),
    F("select", "mapping of AXIS to expression", {}, "Single-step form: see step."),
    F("spec", "mapping of name to expression", {}, "Single-step form: see step."),
    F("bind", "mapping of binding to name", {}, "Single-step form: see step."),
    F("push", "mapping of name to expression", {}, "Single-step form: see step."),
    F("dispatch", "dispatch", None, "Single-step form: see step."),
    F("steps", "list of step", [], "Dispatches recorded in order (instead of the single-step keys)."),
    F("routes", "list of route", [], "Dispatcher form: hand the arguments to another op."),
)
STEP = (
    F("shader", "identifier", REQUIRED, "Shader of this family that the step dispatches.", True),
    F("fixed", "axis mapping", {}, "Axis values fixed for this step (selects its variants)."),
    F("select", "mapping of AXIS to expression", {}, "Every non-fixed axis <- its value (None: any)."),
    F("spec", "mapping of name to expression", {}, "Spec constant <- value for this call."),
    F("bind", "mapping of binding to name", {}, "Binding <- argument, let, output or scratch."),
    F("push", "mapping of name to expression", {}, "Push constant <- value."),
    F("dispatch", "dispatch", REQUIRED, "`global` (invocations) or `groups` (workgroups).", True),
)
ROUTE = (
    F("when", "expression", None, "Condition (arguments and lets); omitted: otherwise."),
    F("op", "identifier", REQUIRED, "Op of this family with the same arguments.", True),
)
OUTPUT = (
    F("name", "identifier", REQUIRED, "Output name (usable in push, spec and dispatch).", True),
    F("shape", "expression", None, "Shape of the output (required unless `alias`)."),
    F("dtype", "expression", None, "torch dtype of the output (required unless `alias`)."),
    F("alias", "identifier", None,
      "A Tensor argument the op writes in place: the output is that argument's device "
      "tensor (a host tensor's upload), bound where the output is bound and returned; "
      "its shape and dtype are the argument's. The argument itself is not bound."),
)
SCRATCH = (
    F("name", "identifier", REQUIRED, "Name (usable in bind, push, spec and dispatch).", True),
    F("shape", "expression", REQUIRED, "Shape of the temporary.", True),
    F("dtype", "expression", REQUIRED, "torch dtype of the temporary.", True),
)
DISPATCH = (
    F("global", "expression", None, "Global size [x, y, z] in invocations."),
    F("groups", "expression", None, "Workgroup counts [x, y, z]."),
)
TABLES = {
    "family": FAMILY,
    "check": CHECK,
    "shader": SHADER,
    "axis": AXIS,
    "binding": BINDING,
    "push constant": PUSH_CONSTANT,
    "spec constant": SPEC_CONSTANT,
    "override": OVERRIDE,
    "op": OP,
    "step": STEP,
    "route": ROUTE,
    "output": OUTPUT,
    "scratch": SCRATCH,
    "dispatch": DISPATCH,
}

DTYPES = ("float32", "float16", "int32", "int8", "uint8")
STORAGES = ("buffer", "texture3d", "texture2d")
IMAGE_STORAGES = ("texture3d", "texture2d")
ACCESS = ("read", "write", "read_write")
PUSH_TYPES = ("int", "uint", "float", "ivec4", "uvec4", "vec4")
SPEC_TYPES = ("int", "uint", "float", "bool")
