"""Check and rewrite the Python expressions of op specs.

Each expression is parsed with `ast`; every free name must be in the scope
the spec allows (schema arguments, `let` names, outputs, `storage`, `torch`,
`math`, a few builtins, the HELPERS below). Helper calls are rewritten to
`rt.<name>` so the generated stub calls `runtime.ops.stub_support`. Errors point
at the file:line:col of the character inside the YAML scalar. This module
must not evaluate anything. Called by `validate.py`; `docs.py` documents the
HELPERS and CAPABILITIES tables.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from codegen.errors import SpecError, did_you_mean
from codegen.model import Expr

# name -> (parameters, what it returns); internals.md §1, runtime/ops/stub_support.py implements them.
HELPERS: dict[str, tuple[str, str]] = {
    "numel": ("t", "number of elements"),
    "last_dim": ("t", "size of the last dimension (1 for a 0-d tensor)"),
    "tokens": ("t", "product of all dimensions but the last (1 for 0-d and 1-d)"),
    "token_shape": ("t", "`t.shape[:-1] + (1,)`"),
    "ceil_div": ("a, b", "`-(-a // b)`"),
    "int_range": ("dtype", "`(min, max)` of an integer dtype"),
    "fp32": ("x", "`x` rounded to the nearest fp32 value"),
    "fp16": ("x", "`x` rounded to the nearest fp16 value (ties to even; +-inf beyond its range)"),
    "fp32_recip": (
        "x",
        "the fp32 reciprocal exactly as PyTorch computes `input * (1.0 / scale)` "
        "for an fp32 input: `fp32(1.0 / x)` with the division in float64",
    ),
    "fits_int32": (
        "t",
        "every value a whole number within int32, of an integer or floating dtype "
        "(device tensors: dtype int32)",
    ),
    "positive_fp32": (
        "t",
        "every value, rounded to fp32, finite and > 0 (device tensors: `True`)",
    ),
    "elementwise": (
        "t, units=1",
        "global size covering `t` with `units` units of 4 values (buffer: "
        "`[ceil(numel/(4*units)), 1, 1]`) or texels of a row (texture3d: the image extents, x "
        "divided by `units`, rounded up) per invocation",
    ),
    "per_storage": ("t, choices", "`choices[0]` for a tensor in a buffer, `choices[1]` for one in an image"),
    "prepacked": (
        "function, *args",
        "`function(*args)` (a `\"module:function\"` path returning a torch tensor), computed "
        "once per tensor identity and version and other argument values, and uploaded once "
        "when bound",
    ),
    "pair": ("v", "a conv argument (an int or a list of 1 or 2 ints) as `(y, x)`, else `None`"),
    "conv2d_params": (
        "x, weights, kernel_size, stride, padding, dilation, groups",
        "the conv's geometry, `runtime.families.conv2d.Conv2dParams` (`N C_in H W C_out KH KW stride "
        "padding dilation groups Cg Coutg H_out W_out`, pairs as `(y, x)`)",
    ),
    "conv2d_output_bounds": (
        "activation, activation_min, activation_max, output_scale, output_zero_point",
        "`(lo, hi)`: the int8 bounds a conv epilogue clamps its output to, relu's and "
        "hardtanh's bounds quantized exactly as the epilogue quantizes (else `(-128, 127)`)",
    ),
    "conv2d_algorithm": (
        "params",
        "`\"pw\"`, `\"dw\"`, `\"im2col\"`, `\"general\"`, `\"pw_coop\"` or "
        "`\"im2col_coop\"`: the winner measured on this device (`python -m runtime tune`), else "
        "OPS.md's choice for its GPU family, pw moved to the cooperative-matrix GEMM and im2col "
        "or direct to its implicit im2col where the shape suits it and the device runs it",
    ),
    "tuned": (
        "params, algorithm",
        "the measured best choice of one algorithm for this conv on this device "
        "(`.algorithm .layout .settings`), or `None`; `ETVK_TUNING=off` gives `None`",
    ),
    "gemm_tiling": (
        "m, k4, c_out, choice=None",
        "the q8ta_gemm tiling of `m` pixels, `k4` K words, `c_out` channels, a `tuned` choice's "
        "when given, else the rule: `.tile_m .tile_n4 .threads_n .split_k .block_k` (spec "
        "constants) and `.groups` (workgroup counts)",
    ),
    "coop_chunk": (
        "kernel, m, k, c_out, choice=None",
        "the K chunk (`\"k64\"` or `\"k128\"`, the CHUNK axis) of cooperative-matrix GEMM "
        "`kernel` (`\"pw\"`: q8ta_gemm_coop, `\"im2col\"`: q8ta_gemm_coop_im2col) for `m` pixels, "
        "`k` K bytes and `c_out` channels: a `tuned` choice's `chunk`, else the rule "
        "(runtime/families/conv2d_tiling.py)",
    ),
    "coop_a_load": (
        "layout, c_in",
        "the input loads (`\"w16\"` or `\"w4\"`, the A_LOAD axis) of the cooperative-matrix "
        "GEMMs: 16 bytes at a time where the input `layout` is 4C and `c_in % 16 == 0`, else 4 "
        "(runtime/families/conv2d_tiling.py)",
    ),
    "coop_k_splits": (
        "kernel, m, k, c_out, choice=None",
        "K_SPLITS of cooperative-matrix GEMM `kernel` (`\"pw\"` or `\"im2col\"`) for `m` pixels, "
        "`k` K bytes and `c_out` channels: a `tuned` choice's `k_splits`, else the rule "
        "(runtime/families/conv2d_tiling.py)",
    ),
    "conv2d_out_w": (
        "choice",
        "OUT_W of the direct and depthwise shaders: a `tuned` choice's, else 4",
    ),
    "linear_uses_coop": (
        "x, weight, group_size",
        "whether linear_qta8a_qga4w runs on cooperative matrices: enough tokens x output rows, "
        "`group_size % 32 == 0` and a device that runs linear_qta8a_qga4w_coop",
    ),
    "linear_uses_coop_few": (
        "x, weight, group_size, storage",
        "whether linear_qta8a_qga4w runs on the few-token cooperative-matrix kernel: 2 tokens "
        "or more, `group_size % 64 == 0`, activations in a buffer and a device that runs "
        "linear_qta8a_qga4w_coop_few",
    ),
    "linear_few_sums": (
        "",
        "axis SUMS of linear_qta8a_qga4w_coop_few: `None` (free: `\"registers\"`, listed first, "
        "unless `\"shared\"` is forced) where the device lays its 16x8 int32 accumulator out as "
        "the registers variants read it (probed once per device: runtime/ops/matrix_layouts.py), "
        "else `\"shared\"`",
    ),
    "linear_few_tiling": (
        "n, tokens, group_size",
        "the tiling of linear_qta8a_qga4w_coop_few for `tokens` x `n` outputs: `.axis` (its "
        "axis SPLIT, from `.split`), `.round` (spec constant ROUND) and `.groups` (workgroup "
        "counts; runtime/families/linear_tiling.py)",
    ),
    "pool2d_params": (
        "x, kernel_size, stride, padding, dilation, ceil_mode",
        "a pooling's geometry, `runtime.families.pool2d.Pool2dParams` (`N C H W KH KW stride "
        "padding dilation ceil_mode H_out W_out`, pairs as `(y, x)`; an empty stride is the "
        "kernel size; H_out or W_out < 1 where PyTorch rejects the arguments)",
    ),
    "global_pool_tiling": (
        "x",
        "the q8ta_global_avg_pool2d tiling of `x`: `.words` (channel words per workgroup, a "
        "spec constant) and `.groups` (workgroup counts)",
    ),
    "layout_of": ("t, default", "the packed int8 layout of a device tensor, `default` for a host tensor or None"),
    "layout_code": ("layout", "the shader code of a packed int8 layout: 4W4C 0, 4C 1, 4C1W 2"),
    "packed_words": ("t", "32-bit words of a device tensor in its packed int8 layout"),
    "on_host": ("t", "`True` for a torch tensor, `False` for a device tensor"),
    "channel_lut_shape": (
        "x, sums",
        "the `[N, Cs + C_x, H, W]` output of a per-channel table op whose first Cs channels come "
        "from window sums `sums` and the rest from `x` (either may be `None`, not both)",
    ),
    "affine_channels": (
        "table",
        "a host per-channel int8 table (`[C, 256]`, or `[C, 255 K + 1]` over window sums) as the "
        "integer affine maps that give every channel's entries (`runtime.families.channel_affine`, "
        "spec constants `AFFINE`, `AFFINE_SUMS`), computed once per table version and kept on disk "
        "(`runtime.ops.affine_cache`); `None` for no table, a device table or where none fits",
    ),
    "copy_quads": (
        "layout=None, width=0, channel_parts=None",
        "whether a copy-like int8 op writes 16-byte quads (spec constant `QUADS`; "
        "`runtime.families.q8ta_copy`): always for an elementwise op (no layout), in 4W4C, in "
        "4C1W for `width % 4 == 0`, in 4C for a concat of `channel_parts` whose parts but the "
        "last have a multiple of 16 channels and whose last has a multiple of 4 channel words",
    ),
    "table_run": (
        "layout, shape, channel_parts, maps",
        "spec constant `RUN` of a per-channel table op writing the packed `shape` "
        "(`runtime.families.q8ta_copy`): 4 pixels in a row an invocation writes a 16-byte quad "
        "at, where the output is in 4C, `copy_quads(layout, shape[3], channel_parts)`, every "
        "table is an integer affine map and no channel comes from window sums (`maps`) and the "
        "runs make enough invocations; else 1",
    ),
    "table_invocations": (
        "shape, run",
        "the invocations of a per-channel table op with `RUN` `run` > 1 writing the packed "
        "`[N, C, H, W]` `shape`: one a quad of 16 channels and run of pixels",
    ),
    "broadcast": (
        "a, b",
        "how `b` broadcasts to `a`'s shape (PyTorch's rules), "
        "`runtime.families.llm.Broadcast` (`.sizes .strides`: `a`'s dimensions merged where `b` "
        "walks them alike, innermost first, padded to 4; `.dims`: how many are real), else `None`",
    ),
    "bad_indices": (
        "indices, size",
        "the values of `indices` outside `[0, size)`, in memory order, as a tuple (device "
        "tensors: `()`)",
    ),
    "scalar_operand": (
        "value, dtype, operation",
        "the fp32 number `a <operation> value` combines with for a tensor `a` of `dtype`, rounded "
        "as PyTorch rounds it (`\"mul\"`: to fp32; `\"add\"`: to `dtype`)",
    ),
    "attention_split": (
        "items, cache_len",
        "how cache_attention splits the keys of `items` (token, kv head) pairs over a cache of "
        "`cache_len` keys: `.chunk_keys` (keys per workgroup) and `.chunks` (workgroups per "
        "pair; 1: one dispatch, no combine; runtime/families/attention.py)",
    ),
    "attention_tile_keys": (
        "tokens, head_dim",
        "keys per tile of cache_attention_tiled for a call of `tokens` query tokens of head dim "
        "`head_dim`, 0 where cache_attention takes its split kernel (few tokens, or a head dim "
        "too large to stage; runtime/families/attention.py)",
    ),
    "attention_lanes": (
        "head_dim",
        "invocations per query row of cache_attention_tiled at head dim `head_dim` on this "
        "device: `TILE_LANES` (2) or fewer, dividing `head_dim / 4` and the device's smallest "
        "subgroup size, where it has subgroup shuffles, else 1 (runtime/families/attention.py)",
    ),
    "pw_pair_max_mid_channels": (
        "",
        "the most output channels of conv1 that q8ta_conv2d_pw_pair keeps in shared memory "
        "(runtime/families/conv2d.py's `PW_PAIR_MAX_MID_CHANNELS`)",
    ),
}

# Device capabilities a shader may `require` (runtime Capabilities.supports names).
CAPABILITIES: tuple[str, ...] = (
    "shader_int8",
    "shader_float16",
    "shader_int16",
    "storage_buffer_8bit",
    "storage_buffer_16bit",
    "integer_dot_product",
    "cooperative_matrix",
    "vulkan_memory_model",
    "maintenance4",
    "subgroup_arithmetic",
    "subgroup_shuffle",
    "coopmat_s8_16x16x32_sg32",
    "coopmat_s8_16x8x32_sg32",
)

BUILTINS: tuple[str, ...] = ("len", "tuple", "int", "float", "min", "max", "abs", "all", "any")
MODULES: tuple[str, ...] = ("torch", "math")
ALWAYS: tuple[str, ...] = ("storage", "None", "True", "False")


@dataclass(frozen=True)
class Rewritten:
    """The stub code of an expression, the free names it mentions (in source order) and
    the modules it uses."""

    code: str
    names: list[str]
    modules: set[str]


def _parse(source: str, expr: Expr, what: str, errors: list[SpecError], prefix: int = 0):
    """Parses `source` (the expression text behind `prefix` extra characters)."""
    try:
        return ast.parse(source, mode="eval")
    except SyntaxError as e:
        line = e.lineno or 1
        lines = source.splitlines() or [""]
        if not e.offset:  # Python reports "unexpected end" at offset 0: point at the end
            col = len(lines[min(line, len(lines)) - 1])
        else:
            col = e.offset - 1
        if line == 1:
            col = max(col - prefix, 0)
        msg = (e.msg or "invalid syntax").replace("f-string: ", "")
        errors.append(SpecError(expr.at(line, col), f"{what}: invalid Python expression: {msg}"))
        return None


class _Rewriter(ast.NodeTransformer):
    def __init__(self, scope: set[str], expr: Expr, what: str, errors: list[SpecError], col0):
        self.scope = scope
        self.expr = expr
        self.what = what
        self.errors = errors
        self.col0 = col0
        self.names: list[tuple[int, int, str]] = []
        self.modules: set[str] = set()
        self.local: set[str] = set()

    def visit_Name(self, node: ast.Name):
        name = node.id
        if not isinstance(node.ctx, ast.Load):
            self.local.add(name)
            return node
        if name in self.local:
            return node
        self.names.append((node.lineno, node.col_offset, name))
        if name in HELPERS:
            return ast.copy_location(
                ast.Attribute(value=ast.Name("rt", ast.Load()), attr=name, ctx=ast.Load()), node
            )
        if name in MODULES:
            self.modules.add(name)
        if name in self.scope or name in BUILTINS or name in MODULES or name in ALWAYS:
            return node
        choices = self.scope | set(BUILTINS) | set(MODULES) | set(HELPERS) | {"storage"}
        col = node.col_offset - (self.col0 if node.lineno == 1 else 0)
        here = ", ".join(sorted(self.scope | {"storage"}))
        self.errors.append(
            SpecError(
                self.expr.at(node.lineno, col),
                f"{self.what}: unknown name '{name}'{did_you_mean(name, choices)}; expected "
                f"one of {here}, torch, math, a builtin ({', '.join(BUILTINS)}) or a helper "
                f"({', '.join(HELPERS)})",
            )
        )
        return node

    def _bind_targets(self, node):
        for sub in ast.walk(node):
            if isinstance(sub, ast.comprehension):
                for t in ast.walk(sub.target):
                    if isinstance(t, ast.Name):
                        self.local.add(t.id)
            if isinstance(sub, ast.Lambda):
                for a in sub.args.args:
                    self.local.add(a.arg)


def rewrite(expr: Expr, scope: set[str], what: str, errors: list[SpecError]) -> Rewritten | None:
    """Checks names and rewrites helper calls; returns None (and adds errors) if invalid."""
    tree = _parse(expr.text, expr, what, errors)
    if tree is None:
        return None
    return _finish(tree, expr, scope, what, errors, 0, fstring=False)


def rewrite_fstring(expr: Expr, scope: set[str], what: str, errors: list[SpecError]):
    """Like `rewrite` for an f-string body; the code is a double-quoted f-string literal."""
    body = expr.text
    tree = _parse("f" + repr(body), expr, what, errors, prefix=2)
    if tree is None:
        return None
    return _finish(tree, expr, scope, what, errors, 2, fstring=True)


def _finish(tree, expr, scope, what, errors, col0, fstring):
    n_errors = len(errors)
    rewriter = _Rewriter(scope, expr, what, errors, col0)
    rewriter._bind_targets(tree)
    tree = rewriter.visit(tree)
    if len(errors) > n_errors:
        return None
    code = _fstring_code(tree.body) if fstring else ast.unparse(tree)
    names = [n for _, _, n in sorted(rewriter.names)]
    return Rewritten(code, names, rewriter.modules)


def _escape_literal(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return out.replace("{", "{{").replace("}", "}}")


def _fstring_code(node: ast.JoinedStr) -> str:
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(_escape_literal(str(value.value)))
        else:
            parts.append("{" + _field_code(value) + "}")
    if all(isinstance(v, ast.Constant) for v in node.values):
        return '"' + "".join(parts).replace("{{", "{").replace("}}", "}") + '"'
    return 'f"' + "".join(parts) + '"'


def _field_code(value: ast.FormattedValue) -> str:
    code = ast.unparse(value.value)
    if code.startswith("{"):
        code = " " + code
    if value.conversion != -1:
        code += "!" + chr(value.conversion)
    if value.format_spec is not None:
        spec = []
        for part in value.format_spec.values:
            if isinstance(part, ast.Constant):
                spec.append(_escape_literal(str(part.value)))
            else:
                spec.append("{" + _field_code(part) + "}")
        code += ":" + "".join(spec)
    return code
