"""Prepacking of 4-bit grouped weights for the `linear_qta8a_qga4w` shaders.

`pack_linear_weights(weight, weight_scales, weight_zeros, group_size)` turns
the OPS.md family 3 weight (uint8 ``[N, K/2]``, two nibbles ``w + 8`` per
byte), its fp32 scales and int32 zero points (``[N, G]``, ``G = K /
group_size``) into one int32 tensor that both shaders (gemv and gemm, see
templates/linear_qta8a_qga4w.glsl.j2) read as 16-byte texels (an ``ivec4``:
a buffer unit, or one texel of a 2-D ``rgba32i`` image). The op spec calls it
through ``prepacked(...)``, so a weight is packed and uploaded once.
The cooperative-matrix kernel reads its own two tensors instead
(`pack_linear_weights_coop`, `pack_linear_meta_coop`): rows of nibbles in k
order, and the per-group metadata in planes; the few-token kernel its own
two (`pack_linear_weights_few`, `pack_linear_meta_few`): one 16-byte unit per
lane of a subgroup and K block, and the metadata of the rows each lane sums.

Layout. Output rows are taken in blocks of 4 (``N4 = ceil(N / 4)`` blocks;
rows past N are padding), and every block is one row of ``R = (J + 2) * G``
texels, ``J = group_size / 8``. The result has shape ``[N4, 4 * R]``: block
``b``'s texel ``t`` is buffer unit ``b * R + t``, or image texel ``(t, b)``.
Texel ``t = j * G + g`` (groups fastest, so the invocations of a gemv
workgroup that take consecutive groups read consecutive texels) holds, in
component ``r`` (row ``n = 4 * b + r``):

- ``j < J``: the 8 weights ``k = g * group_size + 8 * j + i``, ``i = 0..7``,
  as nibbles ``q = w + 8`` in [0, 15]: byte ``i`` (bits ``8i..8i+7``) of the
  word holds ``k + i`` in its low nibble and ``k + 4 + i`` in its high nibble.
  So ``word & 0x0F0F0F0F`` and ``(word >> 4) & 0x0F0F0F0F`` are 4 int8
  values each, byte-aligned with the int8 activation words of ``x[k..k+3]``
  and ``x[k+4..k+7]``: the inner loop is two 4-way int8 dot products.
- ``j == J``: the bits of ``weight_scales[n, g]`` (fp32).
- ``j == J + 1``: ``(c << 4) | zq`` with ``zq = weight_zeros[n, g] + 8`` in
  [0, 15] and ``c = Σ_{k in g} (q - zq) = Σ (w - weight_zeros)`` (an
  arithmetic shift right by 4 recovers ``c``).

Padding rows hold ``q = 8`` (w = 0), ``zq = 8``, ``c = 0`` and scale 0.

With these, the exact group sum of OPS.md is, for token ``m`` with zero
point ``izp``::

    Σ_k (x - izp)(w - wz) = Σ_k x*q - zq * Σ_k x - izp * c

all in int32 (``|Σ x*q| <= 128 * 15 * group_size``). Pure torch on the CPU;
it must not touch Vulkan. Called through the op spec (op_specs/linear.yaml).
"""

from __future__ import annotations

import torch

from runtime.families.int4 import unpack_int4

ROWS_PER_BLOCK = 4
VALUES_PER_TEXEL = 8  # k values of one row in one texel component (8 nibbles)
METADATA_TEXELS = 2  # scales, (c << 4) | zq


def packed_row_texels(k: int, group_size: int) -> int:
    """R: texels per block of 4 output rows, ``(group_size / 8 + 2) * K / group_size``."""
    return (group_size // VALUES_PER_TEXEL + METADATA_TEXELS) * (k // group_size)


def pack_linear_weights(
    weight: torch.Tensor, weight_scales: torch.Tensor, weight_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Packs a 4-bit grouped weight for the linear shaders (layout in the module docstring).

    Args:
        weight: uint8 ``[N, K/2]`` (OPS.md family 3 nibbles).
        weight_scales: fp32 ``[N, K/group_size]``.
        weight_zeros: integer ``[N, K/group_size]``, values in [-8, 7].
        group_size: a multiple of 8 that divides K.

    Returns:
        int32 ``[ceil(N/4), 4 * R]`` with ``R = packed_row_texels(K, group_size)``.
        The op's checks have validated the arguments; this does not re-check.
    """
    n, k = weight.shape[0], 2 * weight.shape[1]
    groups = k // group_size
    j_count = group_size // VALUES_PER_TEXEL
    blocks = -(-n // ROWS_PER_BLOCK)
    rows = blocks * ROWS_PER_BLOCK

    q = torch.full((rows, k), 8, dtype=torch.int32)
    q[:n] = unpack_int4(weight).to(torch.int32) + 8
    zq = torch.full((rows, groups), 8, dtype=torch.int32)
    zq[:n] = weight_zeros.to(torch.int32) + 8
    scales = torch.zeros(rows, groups, dtype=torch.float32)
    scales[:n] = weight_scales.to(torch.float32)

    # [rows, G, J, 2, 4]: (g, j, half, i) -> k = g*gs + 8j + 4*half + i
    q5 = q.reshape(rows, groups, j_count, 2, 4)
    nibbles = q5[:, :, :, 0, :] | (q5[:, :, :, 1, :] << 4)  # byte i: low k+i, high k+4+i
    words = _words(nibbles)  # [rows, G, J]

    c = (q.reshape(rows, groups, group_size) - zq[:, :, None]).sum(dim=-1, dtype=torch.int32)
    meta_corr = (c << 4) | zq
    meta_scale = scales.view(torch.int32)

    # [rows, J + 2, G]: texel index t = j * G + g
    per_row = torch.cat(
        (words.transpose(1, 2), meta_scale[:, None, :], meta_corr[:, None, :]), dim=1
    ).reshape(rows, -1)
    # rows -> (block, r) with r the texel component: [blocks, R, 4]
    packed = per_row.reshape(blocks, ROWS_PER_BLOCK, -1).transpose(1, 2)
    return packed.reshape(blocks, -1).contiguous()


# The cooperative-matrix kernel (templates/linear_qta8a_qga4w_coop.glsl.j2) takes K in
# steps of 32 and output rows in tiles of COOP_ROWS.
COOP_K_STEP = 32
COOP_ROWS = 64


def pack_linear_weights_coop(weight: torch.Tensor) -> torch.Tensor:
    """The 4-bit weights of `pack_linear_weights` laid out for the cooperative-matrix kernel.

    Row ``n`` (N zero padded to a multiple of `COOP_ROWS`, padding rows hold
    ``q = 8``) holds its K nibbles in order, 16 bytes per step of 32 k: word
    ``i`` of step ``s`` holds ``k = 32 s + 8 i .. + 7`` with byte ``b`` (bits
    ``8b..8b+7``) holding ``q[k + b]`` in its low nibble and ``q[k + 4 + b]`` in
    its high nibble, ``q = w + 8`` (the word of `pack_linear_weights`). So
    ``word & 0x0F0F0F0F`` and ``(word >> 4) & 0x0F0F0F0F`` are 4 int8 values
    each, in k order.

    Args:
        weight: uint8 ``[N, K/2]`` (OPS.md family 3 nibbles), K a multiple of 32.

    Returns:
        int32 ``[N_pad, K/8]``; read as 16-byte units, step ``s`` of row ``n`` is
        unit ``n * K/32 + s``.
    """
    n, k = weight.shape[0], 2 * weight.shape[1]
    rows = -(-n // COOP_ROWS) * COOP_ROWS
    q = torch.full((rows, k), 8, dtype=torch.int32)
    q[:n] = unpack_int4(weight).to(torch.int32) + 8
    q4 = q.reshape(rows, k // 8, 2, 4)  # (word, half, byte)
    nibbles = q4[:, :, 0, :] | (q4[:, :, 1, :] << 4)
    return _words(nibbles)


def pack_linear_meta_coop(
    weight: torch.Tensor, weight_scales: torch.Tensor, weight_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Per-group metadata of the cooperative-matrix kernel: int32 ``[2, G, N_pad]``.

    Plane 0 holds the bits of ``weight_scales[n, g]`` (fp32), plane 1
    ``(c << 4) | zq`` as in `pack_linear_weights` (``zq = weight_zeros + 8``,
    ``c = Σ_{k in g} (q - zq)``); groups outer, rows inner, so the invocations
    of a tile read consecutive words. Padding rows (to a multiple of
    `COOP_ROWS`) hold scale 0, ``zq = 8`` and ``c = 0``.
    """
    n, k = weight.shape[0], 2 * weight.shape[1]
    groups = k // group_size
    rows = -(-n // COOP_ROWS) * COOP_ROWS
    q = unpack_int4(weight).to(torch.int32).reshape(n, groups, group_size) + 8
    zq = weight_zeros.to(torch.int32) + 8
    meta = torch.zeros(2, groups, rows, dtype=torch.int32)
    meta[1] = 8
    meta[0, :, :n] = weight_scales.to(torch.float32).contiguous().view(torch.int32).t()
    c = (q - zq[:, :, None]).sum(dim=-1, dtype=torch.int32)
    meta[1, :, :n] = ((c << 4) | zq).t()
    return meta


# The few-token kernel (templates/linear_qta8a_qga4w_coop_few.glsl.j2) takes output rows in
# tiles of FEW_ROWS and K in blocks of FEW_K_BLOCK (two 16x8x32 multiplies).
FEW_ROWS = 16
FEW_K_BLOCK = 64


def pack_linear_weights_few(weight: torch.Tensor) -> torch.Tensor:
    """The 4-bit weights laid out for the few-token kernel: one 16-byte unit per lane.

    N is zero padded to a multiple of `FEW_ROWS` (padding rows hold ``q = 8``).
    Unit ``(tile * K/64 + b) * 32 + lane`` is what lane ``lane = 4 g + t`` of the
    subgroup computing rows ``16 tile .. 16 tile + 15`` reads for K block ``b``:
    its word ``2 s + h`` (``s, h`` in {0, 1}) holds row ``16 tile + g + 8 h``,
    byte ``i`` with ``q[k + i]`` in its low nibble and ``q[k + 32 + i]`` in its
    high one, ``k = 64 b + 16 (t >> 1) + 8 s + 4 (t & 1)`` and ``q = w + 8``.
    So a subgroup reads 512 consecutive bytes per block; the kernel stages the
    low nibbles of the lane's word at matrix k ``4 t .. 4 t + 3`` of its K step
    ``s`` and the high ones at ``4 t + 16 ..``, which is where the activations of
    ``k`` and ``k + 32`` go when lane ``4 g + t`` stores its 16 consecutive bytes
    (``k = 64 b + 16 t ..``) as two words per step.

    Args:
        weight: uint8 ``[N, K/2]`` (OPS.md family 3 nibbles), K a multiple of 64.

    Returns:
        int32 ``[tiles * K/64 * 32, 4]``.
    """
    n, k = weight.shape[0], 2 * weight.shape[1]
    rows = -(-n // FEW_ROWS) * FEW_ROWS
    q = torch.full((rows, k), 8, dtype=torch.int32)
    q[:n] = unpack_int4(weight).to(torch.int32) + 8
    # row = 16 tile + 8 h + g, k = 64 b + 32 half + 16 t1 + 8 s + 4 t0 + i (t = 2 t1 + t0)
    q = q.reshape(rows // FEW_ROWS, 2, 8, k // FEW_K_BLOCK, 2, 2, 2, 2, 4)
    nibbles = q[:, :, :, :, 0] | (q[:, :, :, :, 1] << 4)  # [tile, h, g, b, t1, s, t0, i]
    nibbles = nibbles.permute(0, 3, 2, 4, 6, 5, 1, 7)  # [tile, b, g, t1, t0, s, h, i]
    return _words(nibbles).reshape(-1, 4)


def pack_linear_meta_few(
    weight: torch.Tensor, weight_scales: torch.Tensor, weight_zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Per-group metadata of the few-token kernel: int32 ``[tiles * G * 8, 4]``.

    Unit ``(tile * G + g_k) * 8 + g`` holds, for group ``g_k`` and the rows
    ``r0 = 16 tile + g`` and ``r1 = r0 + 8`` that lanes ``4 g .. 4 g + 3`` sum:
    the bits of ``weight_scales[r0, g_k]`` and ``weight_scales[r1, g_k]``, then
    ``(c << 4) | zq`` of each row as in `pack_linear_meta_coop`. Padding rows
    hold scale 0, ``zq = 8`` and ``c = 0``.
    """
    meta = pack_linear_meta_coop(weight, weight_scales, weight_zeros, group_size)
    rows = -(-weight.shape[0] // FEW_ROWS) * FEW_ROWS
    planes = meta[:, :, :rows].reshape(2, meta.shape[1], rows // FEW_ROWS, 2, 8)  # [p, G, tile, h, g]
    return planes.permute(2, 1, 4, 0, 3).reshape(-1, 4).contiguous()


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """int32 words from bytes ``[..., 4]`` (byte i at bits 8i..8i+7, little-endian)."""
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int32)
    words = (nibbles << shifts).sum(dim=-1, dtype=torch.int64)  # < 2**32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_linear_weights(packed: torch.Tensor, n: int, k: int, group_size: int):
    """Inverse of `pack_linear_weights` (for tests): ``(weight, weight_scales, weight_zeros)``."""
    groups = k // group_size
    j_count = group_size // VALUES_PER_TEXEL
    blocks = packed.shape[0]
    per_row = packed.reshape(blocks, -1, ROWS_PER_BLOCK).transpose(1, 2).reshape(blocks * 4, -1)
    per_row = per_row.reshape(-1, j_count + METADATA_TEXELS, groups)[:n]
    words = per_row[:, :j_count, :].transpose(1, 2).to(torch.int64) & 0xFFFFFFFF  # [n, G, J]
    nibbles = torch.stack([(words >> (8 * i)) & 0xFF for i in range(4)], dim=-1)  # [n, G, J, 4]
    q = torch.stack((nibbles & 0xF, nibbles >> 4), dim=-2).reshape(n, k)  # (half, i)
    w = (q - 8).to(torch.int8)
    scales = per_row[:, j_count, :].contiguous().view(torch.float32)
    zeros = (per_row[:, j_count + 1, :] & 0xF) - 8
    from runtime.families.int4 import pack_int4

    return pack_int4(w), scales, zeros.to(torch.int32)
