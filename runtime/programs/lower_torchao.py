"""torchao's per-token dynamic quantization -> ``etvk.quantize_affine_per_token_dynamic``.

torchao's 8da4w linears (``Int8DynActInt4WeightQuantizer``) quantize their input per token
with ``torchao.choose_qparams_affine`` + ``torchao.quantize_affine``.
`fuse_affine_dynamic_quantize` rewrites such a pair into the etvk op (OPS.md family 1), which
computes torchao's numerics bit for bit, where the pair is provably the op's contract:

- choose: ``"ASYMMETRIC"`` over block size ``[1, ..., 1, K]`` of an fp32 or fp16 input with
  K a multiple of 4, int8 ``[-128, 127]`` (or None: int8's bounds), an eps the op accepts (an
  fp32 value of at least 2**-64, for fp16 input also an fp16 value; None, the smallest normal
  of the input's dtype, is refused), fp32 scales (or None for fp32 input: scales of the
  input's dtype), ``keepdim`` False (scales and zero points of shape ``input.shape[:-1]``);
- quantize: the same input and block size, that choose's scales and zero points, int8
  ``[-128, 127]``.

The op writes int32 zero points; torchao's are whole numbers in ``[-128, 127]`` of its
``zero_point_dtype``, so every cast of them to an explicit dtype reads the op's int32 ones
instead (same values, same result; lower.py's ``drop_identity_casts`` then drops those to
int32, which the fused linears read), and any other reader reads an exact cast of the op's
back to that dtype (dropped with the dead nodes when nothing reads it). What does not match
stays a PyTorch op on the CPU. Pure graph work, no Vulkan; called by lower.py.
"""

from __future__ import annotations

import math

import torch

from runtime.programs.nodes import Node, Ref, ValueSpec
from runtime.programs.rewrite import Rewriter, bind
from runtime.reference.quantize import fp16, fp32

CHOOSE = "torchao.choose_qparams_affine.default"
QUANTIZE = "torchao.quantize_affine.default"
FUSED = "etvk.quantize_affine_per_token_dynamic.default"
_CASTS = ("aten._to_copy.default", "aten.to.dtype")
_EPS_MIN = 2.0**-64  # the op's check on eps
_ZERO_POINT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.float32, torch.float64, torch.float16,
                      torch.bfloat16)


def fuse_affine_dynamic_quantize(rewriter: Rewriter) -> None:
    """Every matching choose_qparams_affine + quantize_affine pair becomes one fused node at the
    choose's place (see the module docstring)."""
    for choose in [n for n in rewriter.program.nodes if n.target == CHOOSE]:
        b = bind(choose)
        if not _per_token_int8(rewriter, b):
            continue
        quantize = next((u for u in rewriter.users.get(choose.outputs[0], ())
                         if _quantizes(u, b, choose)), None)
        if quantize is not None:
            _fuse(rewriter, choose, quantize, b)


def _int8_range(b: dict) -> bool:
    return b["quant_min"] in (None, -128) and b["quant_max"] in (None, 127)


def _per_token_int8(rewriter: Rewriter, b: dict) -> bool:
    """Whether a choose_qparams_affine's bound arguments are the op's (module docstring)."""
    x, eps = b["input"], b["eps"]
    spec = rewriter.program.values.get(x.name) if isinstance(x, Ref) else None
    if spec is None or spec.dtype not in (torch.float32, torch.float16) or not spec.shape \
            or spec.shape[-1] % 4 or spec.shape[-1] == 0:
        return False
    half = spec.dtype == torch.float16
    return (b["mapping_type"] == "ASYMMETRIC" and _int8_range(b) and b["target_dtype"] == torch.int8
            and list(b["block_size"]) == [1] * (len(spec.shape) - 1) + [spec.shape[-1]]
            and isinstance(eps, (int, float)) and not isinstance(eps, bool)
            and _EPS_MIN <= fp32(eps) < math.inf and (not half or fp16(eps) == eps)
            and b["scale_dtype"] in ((torch.float32,) if half else (None, torch.float32))
            and b["zero_point_dtype"] in (None, *_ZERO_POINT_DTYPES) and not b["keepdim"])


def _quantizes(node: Node, choose_args: dict, choose: Node) -> bool:
    """Whether `node` is a quantize_affine of the choose's input and block size with its
    scales and zero points, to int8 [-128, 127]."""
    if node.target != QUANTIZE:
        return False
    b = bind(node)
    return (getattr(b["input"], "name", None) == choose_args["input"].name
            and list(b["block_size"]) == list(choose_args["block_size"])
            and [getattr(b[k], "name", None) for k in ("scale", "zero_point")] == list(choose.outputs)
            and b["output_dtype"] == torch.int8 and _int8_range(b))


def _fuse(rewriter: Rewriter, choose: Node, quantize: Node, b: dict) -> None:
    program = rewriter.program
    scales, zero_points = choose.outputs
    spec = program.values[zero_points]
    int32 = f"{zero_points}_int32"
    while int32 in program.values:
        int32 += "_"
    program.values[int32] = ValueSpec(spec.shape, torch.int32)
    fused = Node(choose.name, FUSED, (b["input"], float(b["eps"])), {}, (quantize.outputs[0], scales, int32))
    cast_back = Node(f"{choose.name}_zero_point", "aten._to_copy.default", (Ref(int32),),
                     {"dtype": spec.dtype}, (zero_points,))
    for user in rewriter.users.get(zero_points, ()):
        if user.target in _CASTS and user.args[:1] == (Ref(zero_points),) and bind(user)["dtype"] is not None:
            user.args = (Ref(int32), *user.args[1:])
    program.nodes.remove(quantize)
    at = program.nodes.index(choose)
    program.nodes[at:at + 1] = [fused, cast_back]
    rewriter.refresh()
