"""What generated dispatch stubs call: `OpDef`, argument checks, variant choice, helpers.

The stubs in ``generated/ops/`` are written by codegen and import this module
as ``rt``. Everything an op spec's expressions may name is defined here (the
list in ``codegen/expressions.py`` must stay equal to ``HELPERS``; a test
checks it). This module validates and selects; it must not record commands
(that is ``command.Stream``) or know any op by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from runtime.errors import ArgumentError, ArgumentTypeError, UnsupportedVariant
from runtime.families import conv2d, conv2d_tiling, conv2d_tuning, linear_tiling, llm, pool2d
from runtime.families.attention import attention_split, attention_tile_keys, attention_tile_lanes
from runtime.families.conv2d import pw_pair_max_mid_channels
from runtime.families.q8ta_copy import copy_quads, table_invocations, table_run
from runtime.ops import matrix_layouts, tuning
from runtime.ops.library import catalog
from runtime.ops.prepack import prepacked
from runtime.reference.quantize import fp16, fp32, fp32_recip
from runtime.vulkan import layouts
from runtime.vulkan.device import get_device
from runtime.vulkan.interface import STORAGES
from runtime.vulkan.tensor import Tensor, texture_extent

# ---------------------------------------------------------------- helpers

# the variants `coop_gemm_kernels` checks a device against, by GEMM kernel
COOP_GEMM_VARIANTS = {"pw": "q8ta_gemm_coop_k64_w4", "im2col": "q8ta_gemm_coop_im2col_k64_w4"}
LINEAR_COOP_VARIANT = "linear_qta8a_qga4w_coop_buffer"  # and `linear_uses_coop`
# Tokens x output rows from which linear_qta8a_qga4w runs on cooperative matrices: on the
# H100 the kernel takes 70-80 us up to 32 x 14336 and beats the tiled gemm from 16 x 14336
# and 64 x 4096 on (benchmarks/linear_bench.py; NOTES.md).
LINEAR_COOP_MIN_WORK = 16 * 14336
LINEAR_FEW_VARIANT = "linear_qta8a_qga4w_coop_few_s4_shared"  # and `linear_uses_coop_few` (all its variants require the same)
# Tokens from which the few-token kernel (tiles of 8 tokens) takes a call, with no upper bound.
# It beats the tiled gemm from 2 tokens on (H200, K = 4096, group 128: 2 x 14336 25.8 against
# 32.2 us, 8 x 14336 26.7 against 43.1; session 16), and since session 19 the many-token
# kernel at every size measured (session 23, benchmarks/NOTES.md): 33 to 4096 tokens x N =
# 4096, 11008, 14336 on the H100 (33 x 14336 77.0 against 138.0 us, 128 x 14336 222.0 against
# 280.4, 1024 x 14336 1735.6 against 1812.2; 4096 x 4096 1896.1 against 1888.0, the one tie),
# 33, 128 and 1024 tokens on the H200 (1024 x 14336 1661.8 against 1793.7).
LINEAR_FEW_MIN_TOKENS = 2


def numel(t) -> int:
    """Number of elements of a torch or device tensor."""
    return int(t.numel())


def last_dim(t) -> int:
    """Size of the last dimension; 1 for a 0-d tensor."""
    return int(t.shape[-1]) if len(t.shape) else 1


def tokens(t) -> int:
    """Product of all dimensions but the last; 1 for 0-d and 1-d tensors."""
    return math.prod(int(d) for d in t.shape[:-1])


def token_shape(t) -> tuple[int, ...]:
    """``t.shape[:-1] + (1,)``: the shape of per-token parameters."""
    return tuple(int(d) for d in t.shape[:-1]) + (1,)


def ceil_div(a: int, b: int) -> int:
    """Integer division rounding up."""
    return -(-a // b)


def int_range(dtype: torch.dtype) -> tuple[float, float]:
    """(min, max) of an integer dtype; unbounded for other dtypes (select rejects them)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return (-math.inf, math.inf)
    info = torch.iinfo(dtype)
    return (info.min, info.max)


def fits_int32(t) -> bool:
    """True when every value is a whole number within int32 (shaders read them as int32).

    Device tensors cannot be read on the host: True when their dtype is int32.
    """
    if not isinstance(t, torch.Tensor):
        return t.dtype == torch.int32
    if t.dtype == torch.bool or t.dtype.is_complex:
        return False
    if t.numel() == 0:
        return True
    if t.dtype.is_floating_point and not bool(torch.isfinite(t).all() and (t == t.round()).all()):
        return False
    info = torch.iinfo(torch.int32)
    return bool(t.min() >= info.min and t.max() <= info.max)


def positive_fp32(t) -> bool:
    """True when every value, rounded to fp32 as the shaders use it, is finite and > 0.

    Device tensors cannot be read on the host, so they pass.
    """
    if not isinstance(t, torch.Tensor):
        return True
    values = t.to(torch.float32)
    return bool(torch.isfinite(values).all() and (values > 0).all())


def elementwise(t, units: int = 1) -> list[int]:
    """Global size with one invocation per `units` units of 4 values of ``t`` in a buffer,
    one per `units` texels of an image row (the image extents, x divided rounding up)."""
    if t.storage == "buffer":
        return [ceil_div(numel(t), 4 * units), 1, 1]
    width, height, depth = texture_extent(t.shape)
    return [ceil_div(width, units), height, depth]


def per_storage(t, choices):
    """``choices[0]`` for a tensor in a buffer, ``choices[1]`` for one in an image."""
    return choices[0] if t.storage == "buffer" else choices[1]


def pair(value) -> tuple[int, int] | None:
    """A conv argument (an int, or a list of 1 or 2 ints) as (y, x); None if it is neither."""
    if _is_int(value):
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) in (1, 2) and all(map(_is_int, value)):
        return (value[0], value[-1])
    return None


def conv2d_params(x, weights, kernel_size, stride, padding, dilation, groups):
    """The `runtime.families.conv2d.Conv2dParams` of a conv (its arguments already checked)."""
    return conv2d.conv2d_params(x.shape, weights.shape, kernel_size, stride, padding, dilation, groups)


def conv2d_output_bounds(activation, activation_min, activation_max, output_scale,
                         output_zero_point) -> tuple[int, int]:
    """The int8 clamp bounds of a conv epilogue (`runtime.families.conv2d.conv2d_output_bounds`)."""
    return conv2d.conv2d_output_bounds(activation, activation_min, activation_max, output_scale,
                                       output_zero_point)


def conv2d_algorithm(params) -> str:
    """What ``etvk.q8ta_conv2d.default`` runs: the measured winner on this device
    (runtime/ops/tuning.py), else `rule_algorithm`."""
    winner = tuning.lookup(params)
    return winner.algorithm if winner else rule_algorithm(params)


def rule_algorithm(params) -> str:
    """What ``etvk.q8ta_conv2d.default`` runs with nothing measured: the rule for this
    device's GPU family (pw, dw, im2col, general), moved to the cooperative-matrix GEMMs
    (pw_coop, im2col_coop) where the shape suits them and this device runs them
    (`runtime.families.conv2d.choose_algorithm`)."""
    caps = get_device().caps
    return conv2d.choose_algorithm(params, caps.family, coop_gemm_kernels(caps))


def coop_gemm_kernels(caps) -> frozenset[str]:
    """The GEMM kernels ("pw", "im2col") a device with capabilities `caps` runs on cooperative
    matrices."""
    return frozenset(kernel for kernel, variant in COOP_GEMM_VARIANTS.items()
                     if catalog().variant(variant).runnable(caps)[0])


def tuned(params, algorithm: str):
    """The measured `Conv2dChoice` of `algorithm` for this conv on this device, or None."""
    return tuning.lookup(params, algorithm)


def gemm_tiling(m: int, k4: int, c_out: int, choice=None):
    """Spec constants and workgroup counts of a q8ta_gemm dispatch: a measured choice's
    settings, else the rule (runtime/families/conv2d_tiling.py)."""
    return conv2d_tiling.gemm_tiling(m, k4, c_out, dict(choice.settings) if choice else None)


def coop_k_splits(kernel: str, m: int, k: int, c_out: int, choice=None) -> int:
    """K_SPLITS of coop GEMM `kernel` ("pw" or "im2col") for `m` pixels, `k` K bytes and `c_out`
    channels: a `tuned` choice's, else the rule (`conv2d_tiling.coop_k_splits`)."""
    return conv2d_tiling.coop_k_splits(kernel, m, k, c_out, dict(choice.settings) if choice else None)


def coop_chunk(kernel: str, m: int, k: int, c_out: int, choice=None) -> str:
    """The CHUNK of coop GEMM `kernel` ("pw" or "im2col") for `m` pixels, `k` K bytes and
    `c_out` channels: a `tuned` choice's, else the rule (`conv2d_tiling.coop_chunk`)."""
    return conv2d_tiling.coop_chunk(kernel, m, k, c_out, dict(choice.settings) if choice else None)


coop_a_load = conv2d_tiling.coop_a_load


def conv2d_out_w(choice) -> int:
    """OUT_W of the direct and depthwise shaders: a measured choice's, else the default."""
    out_w = choice.setting("out_w") if choice else None
    return out_w or conv2d_tuning.DIRECT_OUT_W


def linear_uses_coop(x, weight, group_size: int) -> bool:
    """Whether linear_qta8a_qga4w runs on cooperative matrices: at least
    `LINEAR_COOP_MIN_WORK` tokens x output rows, more than one token, whole 32-value K
    steps per group, and a device that runs the kernel."""
    if tokens(x) < 2 or tokens(x) * weight.shape[0] < LINEAR_COOP_MIN_WORK or group_size % 32:
        return False
    return catalog().variant(LINEAR_COOP_VARIANT).runnable(get_device().caps)[0]


def linear_uses_coop_few(x, weight, group_size: int, storage) -> bool:
    """Whether linear_qta8a_qga4w runs on the few-token cooperative-matrix kernel: at least
    `LINEAR_FEW_MIN_TOKENS` tokens, whole 64-value K blocks per group, activations in a buffer
    (neither preferred nor held in an image) and a device that runs the kernel."""
    if tokens(x) < LINEAR_FEW_MIN_TOKENS or group_size % 64 or storage == "texture3d":
        return False
    if not isinstance(x, torch.Tensor) and x.storage != "buffer":
        return False
    return catalog().variant(LINEAR_FEW_VARIANT).runnable(get_device().caps)[0]


def linear_few_sums() -> str | None:
    """Axis SUMS of linear_qta8a_qga4w_coop_few: free (None) where the device lays its
    16x8 int32 accumulator out as the registers variants read it (`matrix_layouts.MMA_16X8`,
    probed once per device), so that "registers", listed first, is chosen and "shared" may
    be forced; else "shared"."""
    return None if matrix_layouts.has_mma_16x8_accumulator() else "shared"


def linear_few_tiling(n: int, tokens_: int, group_size: int):
    """SPLIT, ROUND and workgroup counts of the few-token kernel
    (`runtime.families.linear_tiling.few_tiling`)."""
    return linear_tiling.few_tiling(n, tokens_, group_size)


def pool2d_params(x, kernel_size, stride, padding, dilation, ceil_mode):
    """The `runtime.families.pool2d.Pool2dParams` of a pooling (its list arguments already checked)."""
    return pool2d.pool2d_params(x.shape, kernel_size, stride, padding, dilation, ceil_mode)


def global_pool_tiling(x):
    """Spec constant and workgroup counts of a global average pool (runtime/families/pool2d.py)."""
    return pool2d.global_pool_tiling(x.shape)


def attention_lanes(head_dim: int) -> int:
    """Invocations per query row of cache_attention_tiled on this device
    (`attention_tile_lanes` with its smallest subgroup size and its subgroup shuffles)."""
    caps = get_device().caps
    return attention_tile_lanes(head_dim, min(caps.subgroup_size_range or (caps.subgroup_size,)),
                                caps.supports("subgroup_shuffle"))


def layout_of(t, default: str) -> str:
    """The packed int8 layout of a device tensor ``t``, or ``default`` for a host tensor or None."""
    return default if t is None or isinstance(t, torch.Tensor) or not t.packed else t.layout


def layout_code(layout: str) -> int:
    """The integer code shaders use for a packed int8 layout (4W4C 0, 4C 1, 4C1W 2)."""
    return layouts.LAYOUT_CODES[layout]


def packed_words(t) -> int:
    """Number of 32-bit words of a device tensor in its packed int8 layout."""
    return layouts.packed_words(t.shape, t.layout)


def on_host(t) -> bool:
    """True for a torch tensor (False for a device tensor)."""
    return isinstance(t, torch.Tensor)


def affine_channels(table):
    """The per-channel int8 `table` ([C, 256] of int8 values, or [C, 255 K + 1] of window sums)
    as the integer affine maps that reproduce every channel's entries
    (``runtime.families.channel_affine``, packed for spec constants ``AFFINE`` and
    ``AFFINE_SUMS``), computed once per table version and kept on disk
    (``runtime.ops.affine_cache``); None for no table, a device table or where no map fits a
    channel (the shaders then read the table)."""
    if not on_host(table):
        return None
    packed = prepacked("runtime.ops.affine_cache:packed_affine_channels", table)
    return packed if packed.value.numel() else None


def channel_lut_shape(x, sums) -> tuple[int, ...]:
    """``[N, Cs + C_x, H, W]``: the output of a per-channel table op whose first Cs channels come
    from window sums ``sums`` and the rest from ``x`` (either may be None, not both)."""
    first = x if x is not None else sums
    channels = sum(t.shape[1] for t in (sums, x) if t is not None)
    return (first.shape[0], channels, *first.shape[2:])


def broadcast(a, b) -> llm.Broadcast | None:
    """How ``b`` broadcasts to ``a``'s shape (`runtime.families.llm.broadcast`), else None."""
    return llm.broadcast(a.shape, b.shape)


def bad_indices(indices, size: int) -> tuple[int, ...]:
    """The values of host ``indices`` outside ``[0, size)``, in memory order.

    Device tensors cannot be read on the host: ``()`` (the shader reads no row outside
    the table for them)."""
    if not isinstance(indices, torch.Tensor):
        return ()
    return llm.bad_indices(indices, size)


scalar_operand = llm.scalar_operand


HELPERS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        numel,
        last_dim,
        tokens,
        token_shape,
        ceil_div,
        int_range,
        fp32,
        fp16,
        fp32_recip,
        fits_int32,
        positive_fp32,
        elementwise,
        per_storage,
        prepacked,
        pair,
        conv2d_params,
        conv2d_output_bounds,
        conv2d_algorithm,
        tuned,
        gemm_tiling,
        coop_chunk,
        coop_a_load,
        coop_k_splits,
        conv2d_out_w,
        linear_uses_coop,
        linear_uses_coop_few,
        linear_few_sums,
        linear_few_tiling,
        pool2d_params,
        global_pool_tiling,
        layout_of,
        layout_code,
        packed_words,
        on_host,
        channel_lut_shape,
        affine_channels,
        copy_quads,
        table_run,
        table_invocations,
        broadcast,
        bad_indices,
        scalar_operand,
        attention_split,
        attention_tile_keys,
        attention_lanes,
        pw_pair_max_mid_channels,
    )
}

# ---------------------------------------------------------------- argument types

_DTYPE_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.int32: "int32",
    torch.int8: "int8",
    torch.uint8: "uint8",
}


def _is_tensor(value) -> bool:
    return isinstance(value, (torch.Tensor, Tensor))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_TYPE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "Tensor": (_is_tensor, "a tensor"),
    "float": (_is_float, "a float"),
    "int": (_is_int, "an int"),
    "bool": (lambda v: isinstance(v, bool), "a bool"),
    "str": (lambda v: isinstance(v, str), "a str"),
    "ScalarType": (lambda v: isinstance(v, torch.dtype), "a torch.dtype"),
    "int[]": (
        lambda v: isinstance(v, (list, tuple)) and all(_is_int(i) for i in v),
        "a list of ints",
    ),
    "float[]": (
        lambda v: isinstance(v, (list, tuple)) and all(_is_float(i) for i in v),
        "a list of floats",
    ),
}


def check_arg(op, arg: str, value, schema_type: str) -> None:
    """Raises `ArgumentTypeError` unless ``value`` fits the schema type (``T?`` allows None)."""
    optional = schema_type.endswith("?")
    base = schema_type.rstrip("?")
    if optional and value is None:
        return
    check, expected = _TYPE_CHECKS[base]
    if not check(value):
        got = "None" if value is None else type(value).__name__
        raise ArgumentTypeError(op, arg, f"expected {expected}, got {got}")


def _axis_value(value):
    """Maps a torch.dtype to its axis-value name; other values pass through."""
    if isinstance(value, torch.dtype):
        return _DTYPE_NAMES.get(value, str(value).removeprefix("torch."))
    return value


def _show(axis_value: str, from_dtype: bool) -> str:
    return f"torch.{axis_value}" if from_dtype else repr(axis_value)


# ---------------------------------------------------------------- OpDef


@dataclass(frozen=True)
class OpDef:
    """One op as generated from its spec: schema, variants, record and fake functions.

    ``variants`` lists (name, axis values) of every variant the op may run: of
    all its steps, or for a dispatcher op (no steps) of every op it routes to.
    ``steps`` holds the variant names of each step; None (the default) means
    one step that may run any variant.
    """

    name: str
    family: str
    schema: str
    doc: str
    spec: str
    reference: str
    variants: tuple[tuple[str, Mapping[str, str]], ...]
    record: Callable[..., Any]
    fake: Callable[..., Any]
    steps: tuple[tuple[str, ...], ...] | None = None
    # (output index, schema argument): that output is the argument's device tensor, written
    # in place by the op and returned (an output with `alias` in the spec).
    aliases: tuple[tuple[int, str], ...] = ()
    # Eager calls may replay a call plan (runtime/ops/plans.py): the checks, lets and
    # dispatch read tensor shapes and dtypes only (codegen/plans.py decides).
    plannable: bool = False
    # (variant, storage, wanted, step) -> (device capabilities, chosen VariantInfo): a choice
    # depends only on these, so repeated calls skip the search (errors are never cached).
    _chosen: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def label(self, name: str, kind: str = "argument") -> str:
        """Prefix for errors about one argument, output or derived value (`let`) of this op."""
        return f"{self.name}: {kind} '{name}'"

    def route(self, target: OpDef, variant: str | None) -> OpDef:
        """The op a dispatcher hands this call to, after checking a forced variant fits it.

        Raises:
            UnsupportedVariant: ``variant`` belongs to another op than ``target``.
        """
        if variant is not None and variant not in dict(target.variants):
            if variant not in dict(self.variants):
                known = ", ".join(name for name, _ in self.variants)
                raise ArgumentError(self, "variant", f"unknown variant {variant!r}; this op has: {known}")
            raise UnsupportedVariant(
                f"{self.name}: variant {variant} cannot serve these inputs: they go to "
                f"{target.name}, whose variants are {', '.join(n for n, _ in target.variants)}"
            )
        return target

    def select(self, variant: str | None, storage: str | None, wanted: Mapping[str, tuple],
               step: int = 0):
        """Chooses the variant that serves one step of a call.

        Args:
            variant: a variant name the caller forces, or None. A variant of
                another step of the op leaves this step free.
            storage: the caller's storage preference ("buffer", "texture3d") or None.
            wanted: axis -> (argument name or None, value); a value of None
                leaves the axis free; torch dtypes match axis values by name.
            step: which step of the op.

        Returns:
            The `runtime.ops.library.VariantInfo` of the chosen variant.

        Raises:
            ArgumentError: an argument asks for an axis value no variant has.
            UnsupportedVariant: the forced variant cannot serve the call, or no
                matching variant can run on this device.
        """
        caps = get_device().caps
        key = (variant, storage, tuple(wanted.items()), step)
        try:
            chosen = self._chosen.get(key)
        except TypeError:  # an unhashable argument: no caching (the search reports it)
            return self._select(variant, storage, wanted, step, caps)
        if chosen is not None and chosen[0] is caps:
            return chosen[1]
        info = self._select(variant, storage, wanted, step, caps)
        self._chosen[key] = (caps, info)
        return info

    def _select(self, variant, storage, wanted, step, caps):
        if storage is not None and storage not in STORAGES:
            raise ArgumentError(self, "storage", f"must be one of {STORAGES} or None, got {storage!r}")
        wanted = dict(wanted)
        names = dict(self.variants) if self.steps is None else self.steps[step]
        candidates = [(name, axes) for name, axes in self.variants if name in names]
        if "STORAGE" in candidates[0][1] and "STORAGE" not in wanted:
            wanted["STORAGE"] = (None, storage)
        library = catalog()
        if variant is not None and (variant in names or variant not in dict(self.variants)):
            return self._check_forced(variant, wanted, library, caps)
        for axis, (arg, value) in wanted.items():
            name = _axis_value(value)
            if name is None:
                continue
            matches = [c for c in candidates if c[1][axis] == name]
            if not matches:
                from_dtype = isinstance(value, torch.dtype)
                offered = sorted({_show(c[1][axis], from_dtype) for c in candidates})
                what = "dtype " if from_dtype else ""
                raise ArgumentError(
                    self,
                    arg or "storage",
                    f"{what}{_show(name, from_dtype)} is not supported; expected one of "
                    + ", ".join(offered),
                )
            candidates = matches
        reasons = []
        for name, _ in candidates:
            info = library.variant(name)
            ok, reason = info.runnable(caps)
            if ok:
                return info
            reasons.append(f"{name}: {reason}")
        raise UnsupportedVariant(
            f"{self.name}: no variant for these inputs runs on {caps.name}: " + "; ".join(reasons)
        )

    def _check_forced(self, variant, wanted, library, caps):
        axes = dict(self.variants).get(variant)
        if axes is None:
            known = ", ".join(name for name, _ in self.variants)
            raise ArgumentError(self, "variant", f"unknown variant {variant!r}; this op has: {known}")
        for axis, (arg, value) in wanted.items():
            name = _axis_value(value)
            if name is not None and axes[axis] != name:
                source = (f"argument '{arg}'" if arg else "the storage preference" if axis == "STORAGE"
                          else "the device")
                raise UnsupportedVariant(
                    f"{self.name}: variant {variant} cannot serve these inputs: {source} asks for "
                    f"{axis}={name}, the variant has {axis}={axes[axis]}"
                )
        info = library.variant(variant)
        ok, reason = info.runnable(caps)
        if not ok:
            raise UnsupportedVariant(f"{self.name}: variant {variant} cannot run on {caps.name}: {reason}")
        return info


__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "HELPERS",
    "OpDef",
    "check_arg",
    *HELPERS,
]
