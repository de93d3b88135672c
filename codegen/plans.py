"""Whether an op's eager calls may reuse a call plan (runtime/ops/plans.py).

A call plan replays a recorded call with new tensor values, skipping the
argument checks, lets and variant choice. That is sound only when none of
them reads a tensor argument's values or depends on anything but the key the
runtime builds (tensor shapes and dtypes, the other arguments' values):

- every use of a tensor argument in a check condition, let, select, spec,
  push, dispatch or output expression is a shape or dtype read
  (``x.shape``, ``x.dtype``, ``x.ndim``, ``x.dim()``, ``x.numel()``,
  ``x.size(...)``, a device tensor's ``packed``, ``layout``, ``storage``) or
  an argument of a shape-only helper (`SHAPE_HELPERS`);
- every helper called is pure: its result follows from its arguments alone
  (`PURE_HELPERS`; not ``prepacked``, ``tuned`` or the device-dependent
  choices);
- the op dispatches itself (a dispatcher's route may follow measurements).

Check messages are not read: they run only when a check fails, and a failed
call makes no plan. Pure analysis of stub code (ast); called by build.py.
"""

from __future__ import annotations

import ast

from codegen.model import ResolvedOp

# Helpers whose result follows from their arguments alone (runtime/ops/stub_support.py).
PURE_HELPERS = frozenset({
    "numel", "last_dim", "tokens", "token_shape", "ceil_div", "int_range", "fp32", "fp16", "fp32_recip",
    "fits_int32", "positive_fp32", "elementwise", "per_storage", "pair", "layout_code",
    "on_host", "layout_of", "packed_words", "pool2d_params", "global_pool_tiling", "coop_chunk",
    "broadcast", "bad_indices", "scalar_operand", "attention_split", "attention_tile_keys",
    "channel_lut_shape", "pw_pair_max_mid_channels", "table_invocations",
})
# The pure helpers that read only the shape, dtype or kind of a tensor passed to them.
SHAPE_HELPERS = frozenset({"numel", "last_dim", "tokens", "token_shape", "on_host", "layout_of",
                           "packed_words", "elementwise", "per_storage", "pool2d_params",
                           "global_pool_tiling", "broadcast", "channel_lut_shape"})
# Attributes that describe a tensor, not its values (the last three: of device tensors).
_SHAPE_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "packed", "layout", "storage"})
_SHAPE_METHODS = frozenset({"dim", "numel", "size"})


def plannable(op: ResolvedOp) -> bool:
    """True when `op`'s checks, lets and dispatch read its tensor arguments' shapes and
    dtypes only and call pure helpers only (see the module docstring)."""
    if op.routes or not op.steps:
        return False
    tensors = {a.name for a in op.spec.schema.args if a.is_tensor}
    codes = [cond for _, _, cond, _, _ in op.checks]
    codes += [code for _, code in op.lets]
    codes += [code for _, shape, dtype in (*op.outputs, *op.scratch) for code in (shape, dtype)]
    for step in op.steps:
        codes += [code for _, _, code in step.select]
        codes += [code for _, code in (*step.push, *step.spec)]
        codes.append(step.dispatch[1])
    return all(_reads_shapes_only(code, tensors) for code in codes)


def _reads_shapes_only(code: str, tensors: set[str]) -> bool:
    tree = ast.parse(code, mode="eval")
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        helper = _helper_name(node)
        if helper is not None and helper not in PURE_HELPERS:
            return False
        if isinstance(node, ast.Name) and node.id in tensors and not _shape_use(node, parents):
            return False
    return True


def _helper_name(node) -> str | None:
    """The helper an ``rt.<helper>(...)`` call names, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "rt"):
        return node.func.attr
    return None


def _shape_use(name: ast.Name, parents: dict) -> bool:
    parent = parents.get(name)
    if isinstance(parent, ast.Attribute):
        if parent.attr in _SHAPE_ATTRIBUTES:
            return True
        return parent.attr in _SHAPE_METHODS and isinstance(parents.get(parent), ast.Call)
    if isinstance(parent, ast.Call) and name in parent.args:
        return _helper_name(parent) in SHAPE_HELPERS
    return False
