"""`runtime.lower`: a quantized ``torch.export`` program -> a device-independent `Program`.

Input: a program quantized with PT2E (static per-tensor int8 activations,
per-channel symmetric int8 weights, as XNNPACKQuantizer's symmetric config
makes them) and/or torchao's 8da4w linears, with or without state (a
decoder's KV cache). The steps:

1. `runtime.pytorch.passes.fuse_quantized_ops` fuses the 8da4w linears;
2. from_export.py converts the graph op for op (mutated buffers become state);
3. ``dequantize_per_tensor -> aten.conv2d -> [relu | hardtanh | hardswish] -> quantize_per_tensor``
   becomes one ``etvk.q8ta_conv2d`` (weight sums, fp32 weight scales and an
   fp32 bias computed once from the constants); its int8 input and output get
   the layout placeholder ``PACKED_INT8_CONV2D``;
4. lower_cnn.py lowers the other int8 CNN patterns (residual adds, gates,
   pools, ReLU6 folded into its conv, the classifier head, concatenation) and
   drops the identities PT2E leaves between them; lower_residual.py fuses a
   residual add of a conv's output into that conv's epilogue; then lower_lut.py turns
   ``dequantize_per_tensor -> elementwise ops -> quantize_per_tensor`` on an int8
   tensor into one ``etvk.q8ta_lut``, its 256-entry table computed by running those
   nodes on the CPU (hardswish, hardsigmoid, sigmoid, silu, gelu, tanh, clamps
   whose qparams change, any chain of them), and a batch norm and elementwise
   ops on a cat of int8 tensors with different qparams (DenseNet) into one
   ``etvk.q8ta_channel_lut`` with a table per channel (and, averaged over H
   and W before the quantize, ``etvk.q8ta_channel_lut_mean``); lower_conv_lut.py
   then folds a lookup of a conv's output into that conv's epilogue;
5. the remaining quantize / dequantize / choose-qparams ops become their
   ``etvk`` twins: a 4-D int8 per-tensor quantize becomes ``q8ta_quantize``
   (packed, placeholder layout) and the dequantize of a packed tensor
   ``q8ta_dequantize``; a cast to the dtype a tensor already has is dropped;
   a choose-qparams whose parameters quantize the same tensor per token to
   int8 fuses with that quantize into ``quantize_per_token_dynamic`` (when
   the last dimension is a multiple of 4), as do torchao's choose_qparams_affine
   and quantize_affine of 8da4w exports (into ``quantize_affine_per_token_dynamic``,
   lower_torchao.py, before the casts are dropped); lower_decoder.py lowers a
   decoder's float ops (embedding, RMSNorm, rotary embedding, KV-cache writes,
   attention over the cache, activation x up, elementwise ops, fp linears)
   and splits a fused 8da4w projection read through slices into one linear
   per slice;
6. what nothing reads is dropped; an RMSNorm or activation x up whose only
   reader is a per-token quantize fuses with it, a residual add with the
   fused RMSNorm that reads it, and an attention layer's rotary embeddings
   of q and k with its two cache writes, and a per-channel table op with the
   concat it reads, DenseNet's layers (lower_fusion.py); the checks the
   program's inputs need on the host are derived (input_checks.py).

A decoder exported with a dynamic token count is lowered once per token
count and combined into one program (token_counts.py).

What matches no pattern stays a PyTorch op: the loader runs it on the CPU.
A pattern is only rewritten where the result is provably the op's contract
(int8 range, symmetric weights, scalar qparams, one consumer in the chain).
Never touches Vulkan. Called by users (`runtime.lower`) and the tools.
"""

from __future__ import annotations

import importlib.metadata

import torch
from torch.export import ExportedProgram

from runtime.families.conv2d_layouts import PLACEHOLDER
from runtime.ops.library import manifest_hash
from runtime.ops.registry import get_op
from runtime.programs import (
    lower_cnn,
    lower_conv_lut,
    lower_conv_pair,
    lower_fusion,
    lower_lut,
    lower_residual,
    lower_torchao,
    token_counts,
)
from runtime.programs.from_export import from_exported
from runtime.programs.input_checks import derive_input_checks
from runtime.programs.lower_decoder import lower_decoder_ops
from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.program import Program
from runtime.programs.rewrite import DQ, FLOATS, Q, Rewriter, bind, conv_activation, int8_per_tensor
from runtime.pytorch.passes import fuse_quantized_ops

_CONV = "aten.conv2d.default"
# quantized_decomposed ops whose etvk twin has the same schema: (etvk target, output dtypes).
_TWINS = {
    "quantized_decomposed.quantize_per_token.default": ("etvk.quantize_per_token.default", None),
    "quantized_decomposed.dequantize_per_token.default": ("etvk.dequantize_per_token.default", None),
    "quantized_decomposed.choose_qparams_per_token_asymmetric.default": (
        "etvk.choose_qparams_per_token_asymmetric.default", (torch.float32, torch.int32)),
}
_CHOOSE = "etvk.choose_qparams_per_token_asymmetric.default"
_QUANTIZE_PER_TOKEN = "etvk.quantize_per_token.default"
_DYNAMIC = "etvk.quantize_per_token_dynamic.default"
# cast target -> the arguments it may have (input, dtype, copy); any other must be default
_CASTS = {"aten._to_copy.default": ("self", "dtype"), "aten.to.dtype": ("self", "dtype", "copy"),
          "aten.type_as.default": ("self", "other")}


class _Lowering(Rewriter):
    """The conv pattern and the quantize edges of one program being lowered."""

    # -- conv -------------------------------------------------------------------------------

    def fuse_conv(self, conv: Node) -> bool:
        """``dq -> conv2d -> [activation] -> q`` -> ``etvk.q8ta_conv2d``; False where it does not match."""
        b = bind(conv)
        x = self.dequantized(b["input"])
        weight = self.symmetric_weight(self.producer(b["weight"]), 4)
        bias = self.fp32_bias(b["bias"])
        if x is None or weight is None or bias is False or len(self.shape(x[0])) != 4:
            return False
        user = self.only_user(conv)
        activation = conv_activation(user)
        # an activation the conv cannot take leaves the conv's only user not a quantize: no match
        activation, last = (activation, user) if activation else (("none",), conv)
        out = self.requantized(last)
        if out is None:
            return False
        wq, sums, scales = weight
        args = (x[0], x[1], x[2], wq, sums, scales, out[1], out[2], bias,
                list(self.program.constants[wq.name].shape[2:]), list(b["stride"]), list(b["padding"]),
                list(b["dilation"]), b["groups"], *activation)
        fused = Node(f"{conv.name}_q8ta", "etvk.q8ta_conv2d.default", args, {}, out[0].outputs)
        for name in (x[0].name, out[0].outputs[0]):
            self.mark_packed(name)
        self.replace(out[0], fused)
        return True

    # -- quantize edges ---------------------------------------------------------------------

    def lower_quantize_ops(self) -> None:
        """The remaining (de)quantize and choose-qparams ops become etvk ops where they fit."""
        for node in list(self.program.nodes):
            new = self._edge(node)
            if new is not None:
                self.replace(node, new)

    def _edge(self, node: Node) -> Node | None:
        values = self.program.values
        if node.target == Q:
            b = bind(node)
            source = values.get(getattr(b["input"], "name", ""))
            if source is None or source.dtype not in FLOATS or b["dtype"] not in (torch.int8, torch.uint8,
                                                                                   torch.int32):
                return None
            if int8_per_tensor(node, Q) is not None and len(source.shape) == 4:
                self.mark_packed(node.outputs[0])
                return Node(node.name, "etvk.q8ta_quantize.default",
                            (b["input"], b["scale"], b["zero_point"], PLACEHOLDER), {}, node.outputs)
            return dataclass_copy(node, "etvk.quantize_per_tensor.default")
        if node.target == DQ:
            b = bind(node)
            source = values.get(getattr(b["input"], "name", ""))
            if source is None or b.get("out_dtype") not in (None, *FLOATS):
                return None
            if source.layout is not None and int8_per_tensor(node, DQ) is not None:
                return Node(node.name, "etvk.q8ta_dequantize.default",
                            (b["input"], b["scale"], b["zero_point"], None), {}, node.outputs)
            if source.dtype in (torch.int8, torch.uint8, torch.int32):
                return dataclass_copy(node, "etvk.dequantize_per_tensor.default")
            return None
        if node.target in _TWINS:
            target, dtypes = _TWINS[node.target]
            if dtypes is not None:
                for name, dtype in zip(node.outputs, dtypes, strict=True):
                    values[name] = ValueSpec(values[name].shape, dtype, values[name].layout)
            return dataclass_copy(node, target)
        return None

    def fuse_dynamic_quantize(self) -> None:
        """``choose_qparams_per_token_asymmetric(x)`` -> (s, z) and ``quantize_per_token(x, s, z,
        -128, 127, int8)`` -> ``quantize_per_token_dynamic(x)`` -> (q, s, z), at the choose's
        place, where x's last dimension is a multiple of 4 (the fused op's requirement)."""
        for choose in [n for n in self.program.nodes if n.target == _CHOOSE]:
            x = choose.args[0]
            shape = self.program.values[x.name].shape if isinstance(x, Ref) else ()
            if not shape or shape[-1] % 4:
                continue
            quantize = next((u for u in self.users.get(choose.outputs[0], ())
                             if u.target == _QUANTIZE_PER_TOKEN and self._quantizes(u, x, choose)), None)
            if quantize is None:
                continue
            fused = Node(choose.name, _DYNAMIC, (x, torch.int8), {},
                         [quantize.outputs[0], *choose.outputs])
            self.program.nodes.remove(quantize)
            self.replace(choose, fused)

    @staticmethod
    def _quantizes(node: Node, x: Ref, choose: Node) -> bool:
        """Whether `node` (a quantize_per_token) quantizes x to int8 [-128, 127] with `choose`'s qparams."""
        b = bind(node)
        return (getattr(b["input"], "name", None) == x.name
                and [getattr(b[k], "name", None) for k in ("scales", "zero_points")] == list(choose.outputs)
                and (b["quant_min"], b["quant_max"], b["dtype"]) == (-128, 127, torch.int8))

    def drop_identity_casts(self) -> None:
        """A cast (``_to_copy`` / ``to`` / ``type_as``) of a tensor to the dtype it already has,
        with nothing else asked, goes: in a functional graph its result is the same values."""
        for node in list(self.program.nodes):
            if node.target not in _CASTS:
                continue
            b = bind(node)
            source = self.program.values.get(getattr(b.get(_CASTS[node.target][0]), "name", ""))
            extras = {k: v for k, v in b.items() if k not in _CASTS[node.target]}
            other = b.get("other")  # type_as: the dtype of `other`
            dtype = b.get("dtype") if other is None else (
                self.program.values[other.name].dtype if isinstance(other, Ref)
                else self.program.constants[other.name].dtype)
            if source is not None and dtype in (None, source.dtype) \
                    and all(v in (None, False) for v in extras.values()):
                self.program.replace_uses(node.outputs[0], node.args[0].name)
                self.program.nodes.remove(node)
                self.refresh()


def dataclass_copy(node: Node, target: str) -> Node:
    """`node` calling `target` instead (same arguments)."""
    return Node(node.name, target, node.args, dict(node.kwargs), node.outputs)


def lower(exported: ExportedProgram, token_sizes: list[int] | None = None) -> Program:
    """Lowers a quantized ``torch.export`` program (see the module docstring).

    Args:
        exported: what ``torch.export.export`` returned for the quantized model.
        token_sizes: for a decoder exported with a dynamic token count, the counts to lower
            a graph for (they must hold 1; default: 1, 2, 4, ... up to
            `token_counts.MAX_CHUNK`). Ignored for static shapes.

    Returns:
        The `Program`; ``program.save(path)`` writes it.

    Raises:
        runtime.programs.from_export.LoweringError: the program holds something a
            runtime program cannot (dynamic shapes other than a decoder's token count,
            parameter or input mutations, higher-order ops).
    """
    exported = fuse_quantized_ops(exported)
    dims = token_counts.token_dims(exported)
    if dims is None:
        return _lower(from_exported(exported))
    symbol, inputs, outputs = dims
    sizes = token_counts.token_sizes(exported, symbol, token_sizes)
    programs = {size: _lower(from_exported(exported, {symbol: size})) for size in sizes}
    return token_counts.combine(programs, inputs, outputs)


def _lower(program: Program) -> Program:
    """The rewrites of the module docstring on a converted program."""
    lowering = _Lowering(program)
    for node in list(program.nodes):
        if node.target == _CONV and node in program.nodes:
            lowering.fuse_conv(node)
    lower_cnn.lower_cnn_ops(lowering)
    program.remove_dead()
    lowering.refresh()
    lower_residual.fuse_residual_adds(lowering)  # counts live readers only: after remove_dead
    lower_lut.lower_lookup_tables(lowering)
    lower_lut.lower_channel_tables(lowering)
    lower_conv_lut.fold_lookup_tables(lowering)
    lower_conv_pair.pair_pointwise_convs(lowering)
    lower_torchao.fuse_affine_dynamic_quantize(lowering)
    lowering.drop_identity_casts()
    lower_decoder_ops(lowering)
    program.remove_dead()
    lowering.refresh()
    lowering.lower_quantize_ops()
    lowering.fuse_dynamic_quantize()
    program.remove_dead()
    lowering.refresh()
    lower_fusion.fuse_decoder_ops(lowering)
    lower_fusion.fuse_concat_tables(lowering)
    # the checks the graph implies, and those a rewrite relied on (consecutive positions)
    program.input_checks = list(dict.fromkeys(derive_input_checks(program) + program.input_checks))
    program.op_schemas = {n.target: get_op(n.target).schema for n in program.nodes if n.is_etvk}
    program.manifest_hash = manifest_hash()
    program.lowered_with = library_versions()
    return program


def library_versions() -> dict[str, str]:
    """The versions of torch and (where installed) torchao, which decide the graph PT2E gives."""
    versions = {"torch": torch.__version__}
    try:
        versions["torchao"] = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        pass
    return versions
