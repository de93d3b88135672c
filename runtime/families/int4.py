"""Packing of signed 4-bit weights into bytes, in the layout of OPS.md family 3.

A weight matrix ``w`` of int8 values in [-8, 7] and shape ``[N, K]`` (K even)
packs into uint8 ``[N, K/2]``: byte ``j`` of row ``n`` holds ``w[n, 2j] + 8`` in
its low nibble and ``w[n, 2j+1] + 8`` in its high nibble. This is the weight
format of ``etvk.linear_qta8a_qga4w``; the graph pass (`runtime.pytorch.passes`) packs
constants with it, the reference kernel and the tests unpack with it. Plain
torch code on the CPU: it must not touch Vulkan.
"""

from __future__ import annotations

import torch

from runtime.errors import ArgumentError, ArgumentTypeError

INT4_MIN = -8
INT4_MAX = 7
_OFFSET = 8


def pack_int4(w: torch.Tensor) -> torch.Tensor:
    """Packs signed 4-bit values, two per byte.

    Args:
        w: int8 ``[N, K]`` with every value in [-8, 7] and K even.

    Returns:
        uint8 ``[N, K/2]``: byte ``j`` of row ``n`` holds ``w[n, 2j] + 8`` in its
        low nibble and ``w[n, 2j+1] + 8`` in its high nibble.

    Raises:
        ArgumentTypeError: ``w`` is not a tensor or not int8 (a `TypeError`).
        ArgumentError: ``w`` is not 2-D, K is odd, or a value lies outside
            [-8, 7] (a `ValueError`).
    """
    _check_tensor("pack_int4", "w", w, torch.int8)
    if w.shape[1] % 2:
        raise ArgumentError("pack_int4", "w", f"needs an even number of columns K, got shape {tuple(w.shape)}")
    if w.numel():
        lo, hi = int(w.min()), int(w.max())
        if lo < INT4_MIN or hi > INT4_MAX:
            raise ArgumentError(
                "pack_int4", "w", f"values must lie in [{INT4_MIN}, {INT4_MAX}], found [{lo}, {hi}]"
            )
    nibbles = (w.to(torch.int32) + _OFFSET).reshape(w.shape[0], w.shape[1] // 2, 2)
    return (nibbles[..., 0] | (nibbles[..., 1] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Unpacks bytes written by `pack_int4`.

    Args:
        packed: uint8 ``[N, K/2]``.

    Returns:
        int8 ``[N, K]`` with values in [-8, 7]; ``unpack_int4(pack_int4(w))``
        equals ``w``.

    Raises:
        ArgumentTypeError: ``packed`` is not a tensor or not uint8.
        ArgumentError: ``packed`` is not 2-D.
    """
    _check_tensor("unpack_int4", "packed", packed, torch.uint8)
    b = packed.to(torch.int32)
    nibbles = torch.stack((b & 0xF, b >> 4), dim=-1) - _OFFSET
    return nibbles.reshape(packed.shape[0], 2 * packed.shape[1]).to(torch.int8)


def _check_tensor(function: str, arg: str, t: object, dtype: torch.dtype) -> None:
    """Raises unless ``t`` is a 2-D tensor of ``dtype``."""
    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(function, arg, f"expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ArgumentTypeError(function, arg, f"expected dtype {dtype}, got {t.dtype}")
    if t.dim() != 2:
        raise ArgumentError(function, arg, f"expected a 2-D tensor, got shape {tuple(t.shape)}")
