"""q8ta_binary benchmark (not a test): GPU time and bandwidth of int8 add, mul, concat and tables.

For real activation shapes (ResNet-50 residual adds, squeeze-and-excite gates,
DenseNet / Inception concats, DenseNet-121's per-channel tables
`q8ta_channel_lut` and EfficientNet's `q8ta_lut`; batch 1 and 32) it times
each op in each packed layout and reports the median GPU time per call and the
bandwidth (bytes of the inputs and the output, packed, over that time; the
tables are not counted), next to the same traffic in torch on CUDA
(``torch.add`` of the int8 tensors, ``torch.cat``, or for the tables a copy of
x), a yardstick of what the memory system gives an elementwise kernel, and the
ratio of the two bandwidths. With ``--one-word`` each row also times the op
within `runtime.families.q8ta_copy.one_word_each` (the copy-like ops' kernels
of one 4-byte word an invocation instead of 16-byte quads) in the same run,
and prints the time ratio quads / one word (`q8ta_channel_lut` runs one word
an invocation either way: its ratio shows the run's noise). The fused
`q8ta_concat_channel_lut` rows (DenseNet-121's layer concats, raw copies, and
their tables; bytes: a, b and both outputs) also time `q8ta_concat` then
`q8ta_channel_lut` of its output (`ConcatThenTable`) in the same run and print
that pair's time and the ratio fused / pair; those named ``Cs|C_a+C_b``
(`Row.sums`: blocks 2-4) have the transition's Cs pooled channels first, from
int32 window sums (their bytes counted) through tables, as both ops read them. With
``--affine`` each per-channel table row (`q8ta_channel_lut`, `q8ta_concat_channel_lut`) also
times the op in the same run with batch-norm and relu tables (`affine_channel_table`, the
window sums' too), which the shaders compute as integer affine maps instead of reading them
(`runtime.families.channel_affine`; the random tables of the other columns fit no map), and
prints the time ratio affine / random tables and the ratio of its GB/s to torch's (``a ratio``,
as ``ratio`` is for the random tables). Inputs are uploaded once; timing follows
benchmarks/NOTES.md (the conv benchmark's `time_ours`: back-to-back calls in one stream, ~1 s
of warm-up replays, median of timestamped calls).

Usage: ``python benchmarks/q8ta_binary_bench.py [--quick] [--repeats R] [--only REGEX] [--one-word]
[--affine]``
(``--quick``: tiny sizes and short warm-up; runs on lavapipe.)
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conv2d_bench import Settings, add_row_options, fmt, time_ours  # noqa: E402  (also turns validation off)
from results import Results  # noqa: E402
from timing import open_device, time_cuda  # noqa: E402

import runtime  # noqa: E402
from runtime.families.q8ta_copy import one_word_each  # noqa: E402
from runtime.tools.examples_q8ta_unary import affine_channel_table  # noqa: E402
from runtime.vulkan import layouts  # noqa: E402
from runtime.vulkan.layouts import PACKED_LAYOUTS  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One row, timed at each batch and layout: the op (`q8ta_<op>`) on a and b of shape [C, H, W]
    (b None: a table op, which takes x alone). `copy`: a, b and the output share their qparams
    (DenseNet's lowered block concats: the shaders copy the bytes, `concat_keeps`). `sums`:
    the fused concat's table output starts with the transition's Cs = `sums` pooled channels,
    from window sums of its 2x2 pool (`TAPS` taps) through their tables (DenseNet-121's blocks
    2-4, after the first two layers: x is then a concat); the row's name spells it as `Cs|`."""

    name: str
    op: str
    a: tuple[int, int, int]
    b: tuple[int, int, int] | None
    copy: bool = False
    sums: int = 0


SHAPES = [
    Row("resnet50 l1 residual add+relu", "add", (256, 56, 56), (256, 56, 56)),
    Row("resnet50 l4 residual add+relu", "add", (2048, 7, 7), (2048, 7, 7)),
    Row("se gate mul 672x14x14", "mul", (672, 14, 14), (672, 1, 1)),
    Row("mul 64x56x56", "mul", (64, 56, 56), (64, 56, 56)),
    Row("densenet concat 128+32 28", "concat", (128, 28, 28), (32, 28, 28)),
    Row("concat 126+34 28 (C_a % 4 = 2)", "concat", (126, 28, 28), (34, 28, 28)),
    Row("inception concat 192+64 28", "concat", (192, 28, 28), (64, 28, 28)),
    Row("densenet block concat 224+32 56", "concat", (224, 56, 56), (32, 56, 56), copy=True),
    Row("densenet block concat 480+32 14", "concat", (480, 14, 14), (32, 14, 14), copy=True),
    Row("densenet channel_lut 256x56x56", "channel_lut", (256, 56, 56), None),
    Row("densenet channel_lut 512x28x28", "channel_lut", (512, 28, 28), None),
    Row("densenet channel_lut 1024x14x14", "channel_lut", (1024, 14, 14), None),
    Row("efficientnet lut 32x112x112", "lut", (32, 112, 112), None),
    Row("densenet concat_lut 64+32 56", "concat_channel_lut", (64, 56, 56), (32, 56, 56), copy=True),
    Row("densenet concat_lut 192+32 56", "concat_channel_lut", (192, 56, 56), (32, 56, 56), copy=True),
    Row("densenet concat_lut 448+32 28", "concat_channel_lut", (448, 28, 28), (32, 28, 28), copy=True),
    Row("densenet concat_lut 960+32 14", "concat_channel_lut", (960, 14, 14), (32, 14, 14), copy=True),
    Row("densenet concat_lut 480+32 7", "concat_channel_lut", (480, 7, 7), (32, 7, 7), copy=True),
    Row("densenet concat_lut 128|32+32 28", "concat_channel_lut", (32, 28, 28), (32, 28, 28), copy=True, sums=128),
    Row("densenet concat_lut 128|320+32 28", "concat_channel_lut", (320, 28, 28), (32, 28, 28), copy=True, sums=128),
    Row("densenet concat_lut 256|352+32 14", "concat_channel_lut", (352, 14, 14), (32, 14, 14), copy=True, sums=256),
    Row("densenet concat_lut 256|704+32 14", "concat_channel_lut", (704, 14, 14), (32, 14, 14), copy=True, sums=256),
    Row("densenet concat_lut 512|448+32 7", "concat_channel_lut", (448, 7, 7), (32, 7, 7), copy=True, sums=512),
]
TABLE_OPS = ("lut", "channel_lut")
CONCATS = ("concat", "concat_channel_lut")
TAPS = 4


class ConcatThenTable:
    """q8ta_concat, then q8ta_channel_lut of its output: the two dispatches that
    q8ta_concat_channel_lut replaces, recorded from its arguments."""

    def record(self, stream, *args):
        concat = runtime.get_op("etvk.q8ta_concat.default").record(stream, *args[:8])
        return runtime.get_op("etvk.q8ta_channel_lut.default").record(stream, concat, *args[8:])


def arguments(op: str, a_shape, b_shape, layout: str | None, copy: bool = False, sums_channels: int = 0,
              affine: bool = False):
    """The op's arguments with a and b int8 (uploaded in `layout`, or on the host when None);
    with `copy`, one set of qparams for a, b and the output. A table op: x and a random table
    (one per channel for channel_lut); the fused concat's table, then with `sums_channels` Cs
    random window sums ``[N, Cs, H, W]`` of `TAPS` values and their table (plain buffers).
    `affine`: the per-channel tables, the sums' too, are batch-norm and relu tables (integer
    affine maps), left on the host (a program's constants), where the op fits the maps."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, a_shape, generator=gen, dtype=torch.int8)
    if op in TABLE_OPS:
        rows = (a_shape[1], 256) if op == "channel_lut" else (256,)
        table = affine_channel_table(rows[0], 0) if affine else \
            torch.randint(-128, 128, rows, generator=gen, dtype=torch.int8)
        return (a if layout is None else Tensor.from_torch(a, layout=layout), table)
    b = torch.randint(-128, 128, b_shape, generator=gen, dtype=torch.int8)
    if layout is not None:
        a, b = Tensor.from_torch(a, layout=layout), Tensor.from_torch(b, layout=layout)
    channels = a_shape[1] + b_shape[1]
    tail = {"concat": (), "concat_channel_lut": (
        affine_channel_table(channels, 0) if affine else
        torch.randint(-128, 128, (channels, 256), generator=gen, dtype=torch.int8),)}
    tail = tail.get(op, ("relu",))
    if sums_channels:
        sums = torch.randint(-128 * TAPS, 127 * TAPS + 1, (a_shape[0], sums_channels, *a_shape[2:]), generator=gen,
                             dtype=torch.int32)
        sums_table = affine_channel_table(sums_channels, 0, taps=TAPS) if affine else \
            torch.randint(-128, 128, (sums_channels, 255 * TAPS + 1), generator=gen, dtype=torch.int8)
        if layout is not None:  # the sums' maps are fitted from a host table only, as in a program
            sums, sums_table = Tensor.from_torch(sums), sums_table if affine else Tensor.from_torch(sums_table)
        tail += (sums, sums_table)
    if copy:
        return (a, 1.0, 0, b, 1.0, 0, 1.0, 0, *tail)
    return (a, 0.031, -3, b, 0.027, 12, 0.043, -128, *tail)


def packed_bytes(shape, layout: str) -> int:
    return 4 * layouts.packed_words(shape, layout)


def time_torch(op: str, a_shape, b_shape, s: Settings) -> float | None:
    """Median seconds of the same int8 traffic in torch on CUDA (a table op: a copy of x)."""
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    a = torch.randint(-128, 128, a_shape, device=dev, dtype=torch.int8)
    if op in TABLE_OPS:
        copy = torch.empty_like(a)

        def fn(_):
            return copy.copy_(a)
        return time_cuda(fn, 1, s.repeats * s.max_calls, s.warmup)
    b = torch.randint(-128, 128, b_shape, device=dev, dtype=torch.int8)
    if op in CONCATS:
        def fn(_):
            return torch.cat([a, b], dim=1)
    else:
        def fn(_):
            return torch.add(a, b)
    return time_cuda(fn, 1, s.repeats * s.max_calls, s.warmup)


def shapes_of(op_kind: str, a_chw, b_chw, batch: int, quick: bool):
    """(a, b, out) shapes at `batch` (b None for a table op); `quick` cuts channels and sizes
    to an eighth (at least 1)."""
    def scaled(chw):
        return (chw[0] // 8, *[max(1, d // 8) for d in chw[1:]]) if quick else chw

    a_shape = (batch, *scaled(a_chw))
    if b_chw is None:
        return a_shape, None, a_shape
    b_shape = (batch, *scaled(b_chw))
    out_c = a_shape[1] + b_shape[1] if op_kind in CONCATS else a_shape[1]
    return a_shape, b_shape, (batch, out_c, *a_shape[2:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_options(parser)
    parser.add_argument("--affine", action="store_true",
                        help="also time the per-channel table ops with tables they compute as affine maps")
    parser.add_argument("--one-word", action="store_true",
                        help="also time the one-word kernels of the copy-like ops (one_word_each)")
    options = parser.parse_args()
    started = time.perf_counter()
    caps = open_device()
    if caps is None:
        return 1
    record = Results("q8ta_binary")
    record.device(caps)
    s = Settings.rows(options.quick, options.repeats)
    print("\n== q8ta_binary ops and int8 tables, median GPU time per call; GB/s = packed bytes "
          "of the inputs and out per second (tables not counted); torch: the same int8 traffic on "
          "CUDA (add / cat / a copy of x); ratio = our GB/s / torch's"
          + ("; 1-word: the one-word kernels (one_word_each), same run, and quads / 1-word time"
             if options.one_word else "") + " ==")
    print(f"{'shape':<32} {'batch':>5} {'layout':<6} {'GPU us':>9} {'GB/s':>8} {'torch us':>9} {'GB/s':>8} "
          f"{'ratio':>6}" + (f" {'1-word us':>9} {'q/1w':>6}" if options.one_word else "")
          + f" {'pair us':>9} {'f/pair':>6}"
          + (f" {'affine us':>9} {'a/rand':>6} {'a ratio':>7}" if options.affine else ""))
    only = re.compile(options.only)
    for batch in (2, 1) if options.quick else (32, 1):
        for row in SHAPES:
            name, op_kind = row.name, row.op
            a_shape, b_shape, out_shape = shapes_of(op_kind, row.a, row.b, batch, options.quick)
            inputs = [x for x in (a_shape, b_shape) if x is not None]
            theirs = None
            for layout in PACKED_LAYOUTS:
                if not only.search(f"{name} {batch} {layout}"):
                    continue
                torch_bytes = sum(torch.Size(x).numel() for x in (*inputs, out_shape))  # the cat's for the fused op
                if theirs is None:
                    theirs = time_torch(op_kind, a_shape, b_shape, s)
                    record.kernel("q8ta_binary", f"{name} b{batch}", "torch CUDA", theirs, torch_bytes)
                op = runtime.get_op(f"etvk.q8ta_{op_kind}.default")
                cs = row.sums // (8 if options.quick else 1)
                # the fused op: the concat and the table output (Cs more channels), and the sums
                outputs = ((out_shape, (batch, cs + out_shape[1], *out_shape[2:]))
                           if op_kind == "concat_channel_lut" else (out_shape,))
                sums_bytes = 4 * batch * cs * out_shape[2] * out_shape[3]
                moved = sum(packed_bytes(x, layout) for x in (*inputs, *outputs)) + sums_bytes
                args = arguments(op_kind, a_shape, b_shape, layout, row.copy, cs)
                timed = [time_ours(op, args, moved, s)]
                if options.one_word:
                    with one_word_each():
                        timed.append(time_ours(op, args, moved, s))
                if None in timed:
                    print("device has no timestamp queries")
                    return 1
                ours = timed[0][0]
                record.kernel("q8ta_binary", f"{name} b{batch}", f"etvk {layout}", ours, moved)
                rate, torch_rate = moved / ours / 1e9, theirs and torch_bytes / theirs / 1e9
                line = (f"{name:<32} {batch:>5} {layout:<6} {ours * 1e6:>9.1f} {rate:>8.1f} "
                        f"{fmt(theirs and theirs * 1e6, '.1f', 9)} {fmt(torch_rate, '.1f', 8)} "
                        f"{fmt(torch_rate and rate / torch_rate, '.2f', 6)}")
                if options.one_word:
                    one_word = timed[1][0]
                    record.kernel("q8ta_binary", f"{name} b{batch}", f"etvk {layout} one word", one_word, moved)
                    line += f" {one_word * 1e6:>9.1f} {ours / one_word:>6.2f}"
                if op_kind == "concat_channel_lut":
                    pair = time_ours(ConcatThenTable(), args, moved, s)[0]
                    record.kernel("q8ta_binary", f"{name} b{batch}", f"etvk {layout} concat + channel_lut", pair,
                                  moved)
                    line += f" {pair * 1e6:>9.1f} {ours / pair:>6.2f}"
                elif options.affine and op_kind == "channel_lut":
                    line += f" {'':>9} {'':>6}"
                if options.affine and op_kind in ("channel_lut", "concat_channel_lut"):
                    affine = time_ours(op, arguments(op_kind, a_shape, b_shape, layout, row.copy, cs, affine=True),
                                       moved, s)[0]
                    record.kernel("q8ta_binary", f"{name} b{batch}", f"etvk {layout} affine tables", affine, moved)
                    line += (f" {affine * 1e6:>9.1f} {affine / ours:>6.2f} "
                             f"{fmt(torch_rate and moved / affine / 1e9 / torch_rate, '.2f', 7)}")
                print(line, flush=True)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
