"""Per-channel int8 tables as integer affine maps, where one reproduces every entry.

A per-channel table op (``q8ta_channel_lut``, ``q8ta_concat_channel_lut``) maps value q of
channel c to ``table[c, q + 128]`` (and a window sum S of K taps to ``sums_table[c, S + 128 K]``).
Where the table comes from an affine function followed by a rounding and clamps (DenseNet's
batch norm, relu and requantization before each conv, of an int8 value or of an average pool's
window), it is ``clamp((q * M + N) >> S, lo, hi)`` for integers M, N, S, lo, hi of the channel,
with ``>>`` arithmetic (floor division by 2^S) and no int32 overflow for any q.
`fit_affine_channels` finds such integers for each channel and keeps them only if they give back
every one of its entries (checked here, for every q), so a shader computing the map writes the
table's bytes exactly, without reading the table: no load whose address depends on the data.

Packing for the shaders (``AFFINE`` 1, include/channel_table.glslh): int32 words (as their
bytes), for each channel word c4 (channels 4 c4 .. 4 c4 + 3) 12 words, ivec4 ``3 c4 + k``
holding for its 4 channels M (k = 0), N (1) and ``S | (lo & 0xFF) << 8 | (hi & 0xFF) << 16``
(2); padding channels are all 0 (their value 0). Three 16-byte loads a word of 4 channels.
"""

from __future__ import annotations

import torch

_INT32 = 2**31
_ELEMENTS = 2**19  # channels x entries a step ([C, 2, T] int64 tensors, 8 MB)


def entry_values(entries: int) -> torch.Tensor:
    """The value q of each entry of a table of `entries` = 255 K + 1 entries (K >= 1): entry i
    holds q = i - 128 K, so q runs over -128 K .. 127 K (K = 1: the int8 values, a table of x;
    K taps: the window sums of a pool, a table of the sums)."""
    if entries < 256 or (entries - 1) % 255:
        raise ValueError(f"a per-channel table has 255 K + 1 entries (K >= 1), got {entries}")
    taps = (entries - 1) // 255
    return torch.arange(entries, dtype=torch.int64) - 128 * taps


def _shift(q: torch.Tensor, slope: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The largest shift S <= 24 per channel whose terms q * M + N, |M| ~ |slope| 2^S and |N| ~
    |offset| 2^S, stay below 2^29 for every q (a quarter of int32's range: room for the
    estimate's error; the fit checks the exact bound)."""
    bound = float(q.abs().max()) * slope.abs() * 1.25 + offset.abs() + 2
    return (29 - torch.ceil(torch.log2(bound))).clamp(0, 24).to(torch.int64)


def _near(table: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """The entries a least-squares estimate uses: those strictly between the clamps and their
    neighbours, and both sides of every change (a step's two sides at least)."""
    inner = (table > lo[:, None]) & (table < hi[:, None])
    near = inner | torch.roll(inner, 1, 1) | torch.roll(inner, -1, 1)
    changes = torch.zeros_like(inner)
    changes[:, 1:] = table[:, 1:] != table[:, :-1]
    return near | changes | torch.roll(changes, -1, 1)


def _estimate(q: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares slope and offset per channel of ``t + 0.5`` against q (both ``[C, E]``) over
    the points `w` marks."""
    w = w.to(torch.float64)
    qf, tf = q.to(torch.float64), t.to(torch.float64) + 0.5
    count = w.sum(1).clamp(min=1)
    mq = (w * qf).sum(1) / count
    mt = (w * tf).sum(1) / count
    dq = qf - mq[:, None]
    var = (w * dq ** 2).sum(1).clamp(min=1e-12)
    slope = (w * dq * (tf - mt[:, None])).sum(1) / var
    return slope, mt - slope * mq


def fit_affine_channels(table: torch.Tensor) -> torch.Tensor | None:
    """``[C, 5]`` int64 (M, N, S, lo, hi) per channel of an int8 ``[C, T]`` table (T = 255 K + 1
    entries, `entry_values`) such that ``clamp((q * M + N) >> S, lo, hi)`` is the table's entry
    for q, for every q, with ``|q * M + N| < 2^31``; None if some channel has no such map."""
    if table.dim() != 2 or table.dtype != torch.int8:
        raise ValueError(f"a per-channel table is [C, T] int8, got {list(table.shape)} {table.dtype}")
    q = entry_values(table.shape[1])
    fits = [_fit_rows(q, rows) for rows in table.split(max(1, _ELEMENTS // table.shape[1]))]
    if any(f is None for f in fits):
        return None
    fit = torch.cat(fits) if fits else torch.zeros(0, 5, dtype=torch.int64)
    return fit if check_affine_channels(fit, table) else None  # the bounds guarantee it; checked


def check_affine_channels(fit: torch.Tensor, table: torch.Tensor) -> bool:
    """Whether `fit` is a ``[C, 5]`` int64 (M, N, S, lo, hi) per channel of the int8 ``[C, T]``
    `table` that gives back every entry in the shaders' arithmetic: 0 <= S <= 24, -128 <= lo <=
    hi <= 127, ``|q * M + N| < 2^31`` for every q, and the map of each q its entry."""
    if fit.dtype != torch.int64 or tuple(fit.shape) != (table.shape[0], 5):
        return False
    m, n, s, lo, hi = fit.unbind(1)
    if not bool(((s >= 0) & (s <= 24) & (lo >= -128) & (lo <= hi) & (hi <= 127)).all()):
        return False
    q = entry_values(table.shape[1])
    if fit.shape[0] and int((q[None, :] * m[:, None] + n[:, None]).abs().max()) >= _INT32:
        return False
    return torch.equal(affine_values(fit, q), table.to(torch.int64))


def _fit_rows(q: torch.Tensor, table: torch.Tensor) -> torch.Tensor | None:
    """`fit_affine_channels` for a few channels, whose entries hold the values `q`.

    At each channel's shift S the map needs, for every q, L_q <= q M + N <= U_q (between the
    clamps floor((q M + N) / 2^S) == t_q; at lo only the upper bound, at hi only the lower). For
    a multiplier M the offsets that work are max(L_q - q M) .. min(U_q - q M); the gap between
    the two is a convex function of M, and the fit exists where it is <= 0. The search tries the
    least-squares estimate, then bisects the range two far-apart pairs of constraints allow
    (`_bracket`) towards the gap's minimum, each channel stopping at its first M that fits. Only
    the ends of each run of equal entries constrain it (below)."""
    t = table.to(torch.int64)
    lo, hi = t.min(1).values, t.max(1).values
    # Within a run of equal entries the bounds are equal and q M + N is linear in q, so the run's
    # two ends bound it: the constraints are those of the runs' ends, gathered per channel (the
    # shorter rows padded with their first end, a repeat that changes no max or min). The
    # estimate, too, is fitted over the ends near the clamps' inside.
    ends = torch.ones_like(t, dtype=torch.bool)
    ends[:, 1:-1] = (t[:, 1:-1] != t[:, :-2]) | (t[:, 1:-1] != t[:, 2:])
    order = torch.argsort((~ends).to(torch.int8), dim=1, stable=True)[:, :int(ends.sum(1).max())]
    kept = torch.gather(ends, 1, order)
    near = kept & torch.gather(_near(t, lo, hi), 1, order)
    order = torch.where(kept, order, order[:, :1])
    t, qs = torch.gather(t, 1, order), q[order]
    slope, offset = _estimate(qs, t, near)
    shift = _shift(q, slope, offset)
    unit = (1 << shift)[:, None]  # 2^S
    lower = torch.where(t > lo[:, None], t * unit, -_INT32 * _INT32)  # [C, E]
    upper = torch.where(t < hi[:, None], (t + 1) * unit - 1, _INT32 * _INT32)

    def offsets(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The least and greatest offsets N that work with multipliers `m` (``[C, k]``)."""
        qm = qs[:, None, :] * m[:, :, None]
        return (lower[:, None, :] - qm).max(2).values, (upper[:, None, :] - qm).min(2).values

    scale = torch.pow(2.0, shift.to(torch.float64))
    estimate = torch.round(slope * scale).to(torch.int64)
    reach = torch.ceil((1 + slope.abs()) * scale).to(torch.int64) + 2  # the estimate is rough on steps
    a, b = _bracket(qs, lower, upper, kept & (t > lo[:, None]), kept & (t < hi[:, None]),
                    estimate - reach, estimate + reach)
    if bool((a > b).any()):
        return None
    # the estimate first, then a bisection on the sign of the gap's slope: the gap is convex, so
    # if gap(m) <= gap(m + 1) a minimum lies in [a, m], else in [m + 1, b]; a channel stops
    # (a == b) at the first m that fits
    guess = torch.minimum(torch.maximum(estimate, a), b)
    n_lo, n_hi = offsets(guess[:, None])
    fits = (n_lo <= n_hi)[:, 0]
    a, b = torch.where(fits, guess, a), torch.where(fits, guess, b)
    while bool((a < b).any()):
        mid = torch.div(a + b, 2, rounding_mode="floor")
        n_lo, n_hi = offsets(torch.stack([mid, mid + 1], 1))
        gap = n_lo - n_hi
        left = gap[:, 0] <= gap[:, 1]
        a, b = torch.where(left, a, mid + 1), torch.where(left, mid, b)
        fits = (gap[:, 0] <= 0) & (a < b)
        a, b = torch.where(fits, mid, a), torch.where(fits, mid, b)
    n_lo, n_hi = (v[:, 0] for v in offsets(a[:, None]))
    if not bool((n_lo <= n_hi).all()):
        return None
    return torch.stack([a, torch.div(n_lo + n_hi, 2, rounding_mode="floor"), shift, lo, hi], 1)


def _bracket(qs: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, has_lower: torch.Tensor,
             has_upper: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[a, b] narrowed to the multipliers that two pairs of far-apart constraints allow, so that
    the bisection starts from a range about 2^S / (q's span) wide instead of 2^S.

    A lower bound L_i <= q_i M + N and an upper bound q_j M + N <= U_j together need
    (q_j - q_i) M <= U_j - L_i: M <= (U_j - L_i) / (q_j - q_i) where q_j > q_i, M >= it where
    q_j < q_i. The pairs (first lower, last upper) and (last lower, first upper) by q give the
    tightest such bounds for increasing and decreasing maps alike (`has_lower`, `has_upper`: the
    constraints that are not clamps' sentinels, q ascending in each row)."""
    rows = torch.arange(qs.shape[0])
    span = qs.shape[1] - 1

    def first(mask: torch.Tensor) -> torch.Tensor:
        return mask.to(torch.int8).argmax(1)

    def last(mask: torch.Tensor) -> torch.Tensor:
        return span - mask.flip(1).to(torch.int8).argmax(1)

    both = has_lower.any(1) & has_upper.any(1)
    for i, j in ((first(has_lower), last(has_upper)), (last(has_lower), first(has_upper))):
        d = qs[rows, j] - qs[rows, i]
        num = upper[rows, j] - lower[rows, i]
        bound = torch.div(num, d.clamp(min=1), rounding_mode="floor")
        b = torch.where(both & (d > 0), torch.minimum(b, bound), b)
        bound = -torch.div(num, (-d).clamp(min=1), rounding_mode="floor")  # ceil(num / d), d < 0
        a = torch.where(both & (d < 0), torch.maximum(a, bound), a)
    return a, b


def affine_values(fit: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``[C, len(q)]`` int64: each channel's map of `fit` (as `fit_affine_channels` returns it) at
    the values `q`, in int32 arithmetic as the shaders compute it."""
    m, n, s, lo, hi = (fit[:, k:k + 1] for k in range(5))
    v = (q[None, :] * m + n).to(torch.int32).to(torch.int64)  # the shader's int32 (no wrap: checked)
    return torch.maximum(torch.minimum(v >> s, hi), lo)


def pack_fit(fit: torch.Tensor | None) -> torch.Tensor:
    """The shaders' int32 words of the maps `fit` (module docstring) as their int8 bytes (the
    binding of the table they replace is int8), or an empty int8 tensor for None (no map fits
    every channel)."""
    if fit is None:
        return torch.zeros(0, dtype=torch.int8)
    c = fit.shape[0]
    c4 = -(-c // 4)
    m, n, s, lo, hi = fit.unbind(1)
    bounds = s | ((lo & 0xFF) << 8) | ((hi & 0xFF) << 16)
    padded = torch.zeros(c4 * 4, 3, dtype=torch.int64)
    padded[:c] = torch.stack([m, n, bounds], 1)
    # [c4, 4 channels, 3 values] -> [c4, 3 values, 4 channels]
    return padded.view(c4, 4, 3).permute(0, 2, 1).reshape(-1).to(torch.int32).contiguous().view(torch.int8)
