"""Packed int8 activation layouts of the conv family (OPS.md "Packed int8 activations").

Converts an int8 ``[N, C, H, W]`` torch tensor to the bytes a device buffer
holds in one of the layouts ``4W4C``, ``4C`` and ``4C1W``, and back. Four int8
values share one 32-bit word, little-endian: the byte ``c % 4`` of a word holds
channel ``c``. Channels are padded up to a multiple of 4 (and widths too for
``4W4C``) with zero bytes. Everything is vectorised torch (pad, reshape,
permute); no per-element Python loops.

It must not touch Vulkan, choose layouts (runtime/conv2d.py resolves the
``PACKED_INT8_CONV2D`` placeholder) or know about ops. Called by the device
tensor code (upload / download of packed tensors), the conv2d references and
the tests, which also use it as the host model of the layouts.
"""

from __future__ import annotations

import torch

PACKED_LAYOUTS = ("4W4C", "4C", "4C1W")
# The integer code of each layout; GLSL receives it as a specialization constant.
LAYOUT_CODES = {"4W4C": 0, "4C": 1, "4C1W": 2}
_BYTE_DTYPES = (torch.int8, torch.uint8)


def _ceil4(n: int) -> int:
    return -(-n // 4)


def check_layout(layout: str) -> str:
    """Returns ``layout`` if it is one of `PACKED_LAYOUTS`.

    Raises:
        ValueError: ``layout`` is not a packed int8 layout.
    """
    if layout not in PACKED_LAYOUTS:
        raise ValueError(
            f"layout {layout!r} is not a packed int8 layout; use one of {', '.join(PACKED_LAYOUTS)}"
        )
    return layout


def _check_shape(shape) -> tuple[int, int, int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != 4 or min(shape) < 0:
        raise ValueError(f"packed int8 layouts need a 4-D [N, C, H, W] shape, got {list(shape)}")
    return shape  # type: ignore[return-value]


def packed_words(shape, layout: str) -> int:
    """Number of 32-bit words a tensor of ``shape`` takes in ``layout``.

    Args:
        shape: ``[N, C, H, W]``.
        layout: one of `PACKED_LAYOUTS`.

    Returns:
        ``N*H*W4*C4*4`` for 4W4C, ``N*H*W*C4`` for 4C and 4C1W
        (``C4 = ceil(C/4)``, ``W4 = ceil(W/4)``).

    Raises:
        ValueError: ``shape`` is not 4-D or ``layout`` is unknown.
    """
    n, c, h, w = _check_shape(shape)
    check_layout(layout)
    if layout == "4W4C":
        return n * h * _ceil4(w) * _ceil4(c) * 4
    return n * h * w * _ceil4(c)


def pack(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Packs an int8 ``[N, C, H, W]`` tensor into ``layout``.

    Args:
        x: int8 tensor of exactly 4 dimensions.
        layout: one of `PACKED_LAYOUTS`.

    Returns:
        A contiguous int8 tensor of ``packed_words(x.shape, layout) * 4`` bytes
        (view it as int32 for the words); padding bytes are 0.

    Raises:
        TypeError: ``x`` is not int8.
        ValueError: ``x`` is not 4-D or ``layout`` is unknown.
    """
    if x.dtype != torch.int8:
        raise TypeError(f"pack expects an int8 tensor, got {x.dtype}")
    n, c, h, w = _check_shape(x.shape)
    check_layout(layout)
    c4, w4 = _ceil4(c), _ceil4(w)
    wp = w4 * 4 if layout == "4W4C" else w
    # Zero-pad channels (and widths for 4W4C) at the end: [N, C4*4, H, Wp].
    padded = torch.nn.functional.pad(x, (0, wp - w, 0, 0, 0, c4 * 4 - c))
    blocks = padded.reshape(n, c4, 4, h, wp)  # n, c/4, c%4, h, w
    if layout == "4C":  # N, H, W, C/4, c%4
        out = blocks.permute(0, 3, 4, 1, 2)
    elif layout == "4C1W":  # N, H, C/4, W, c%4
        out = blocks.permute(0, 3, 1, 4, 2)
    else:  # 4W4C: N, H, W/4, C/4, w%4, c%4
        out = blocks.reshape(n, c4, 4, h, w4, 4).permute(0, 3, 4, 1, 5, 2)
    return out.contiguous().reshape(-1)


def unpack(data: torch.Tensor, shape, layout: str) -> torch.Tensor:
    """Unpacks bytes in ``layout`` back to an int8 ``[N, C, H, W]`` tensor.

    Args:
        data: the packed bytes (int8 or uint8) or words (int32), any shape;
            exactly ``packed_words(shape, layout)`` words in all.
        shape: ``[N, C, H, W]`` of the unpacked tensor.
        layout: one of `PACKED_LAYOUTS`.

    Returns:
        A contiguous int8 tensor of ``shape``; padding bytes are dropped.

    Raises:
        TypeError: ``data`` is not int8, uint8 or int32.
        ValueError: bad ``shape`` or ``layout``, or ``data`` has the wrong size.
    """
    n, c, h, w = _check_shape(shape)
    words = packed_words(shape, layout)
    if data.dtype not in (*_BYTE_DTYPES, torch.int32):
        raise TypeError(f"unpack expects int8, uint8 or int32 data, got {data.dtype}")
    raw = data.contiguous().reshape(-1).view(torch.int8)
    if raw.numel() != words * 4:
        raise ValueError(
            f"{layout} data for shape {list(shape)} must hold {words} words "
            f"({words * 4} bytes), got {raw.numel()} bytes"
        )
    c4, w4 = _ceil4(c), _ceil4(w)
    if layout == "4C":
        blocks = raw.reshape(n, h, w, c4, 4).permute(0, 3, 4, 1, 2)
    elif layout == "4C1W":
        blocks = raw.reshape(n, h, c4, w, 4).permute(0, 2, 4, 1, 3)
    else:  # 4W4C stored as N, H, W/4, C/4, w%4, c%4
        blocks = raw.reshape(n, h, w4, c4, 4, 4).permute(0, 3, 5, 1, 2, 4)
    padded = blocks.reshape(n, c4 * 4, h, w4 * 4 if layout == "4W4C" else w)
    return padded[:, :c, :, :w].contiguous()
