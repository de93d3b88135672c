"""q8ta gather and pool benchmark (not a test): GPU time and bandwidth of the int8 ops that move
channels or pool windows (ShuffleNetV2's shuffles and splits, GoogLeNet's ceil-mode max pools,
Inception's average pools, the adaptive pools of VGG, DenseNet's transition window sums).

For real activation shapes (batch 1 and 32) it times each op in each packed layout and reports
the median GPU time per call and the bandwidth (bytes of the packed input and output over that
time; window sums: plain int32), next to a copy of the same bytes measured in the same run (the
faster of vkCmdCopyBuffer and, with CUDA, torch's copy kernel: half the bytes read, half
written), and the ratio of the two bandwidths: issue 42's yardstick (60 % of a copy). Inputs are
uploaded once; timing follows benchmarks/NOTES.md (the conv benchmark's `time_ours`: back-to-back
calls in one stream, ~1 s of warm-up replays, median of timestamped calls).

Usage: ``python benchmarks/q8ta_gather_pool_bench.py [--quick] [--repeats R] [--only REGEX]``
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
from copy_bandwidth import copy_seconds  # noqa: E402
from results import Results  # noqa: E402
from timing import cuda_copy_seconds, open_device  # noqa: E402

import runtime  # noqa: E402
from runtime.vulkan import layouts  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402
from runtime.vulkan.layouts import PACKED_LAYOUTS  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

QPARAMS = (0.031, -3, 0.027, 5)  # input scale and zero point, output scale and zero point (pools)


@dataclass(frozen=True)
class Row:
    """One row, timed at each batch and layout: `etvk.q8ta_<op>` on x of shape [C, H, W] with the
    op's arguments after x (the average pools' qparams first come from QPARAMS). With --quick
    the channels and sizes are cut to an eighth (at least 1): the arguments must suit both."""

    name: str
    op: str
    chw: tuple[int, int, int]
    args: tuple


SHAPES = [
    Row("shufflenet shuffle 116x28x28", "channel_gather", (116, 28, 28), (0, 116, 2)),
    Row("shufflenet split 232x14x14", "channel_gather", (232, 14, 14), (116, 116, 1)),
    Row("shufflenet shuffle 464x7x7", "channel_gather", (464, 7, 7), (0, 464, 2)),
    Row("googlenet max_pool 3x3 s2 ceil 64x112x112", "max_pool2d", (64, 112, 112),
        ([3, 3], [2, 2], [0, 0], [1, 1], True)),
    Row("googlenet max_pool 3x3 s2 ceil 480x28x28", "max_pool2d", (480, 28, 28),
        ([3, 3], [2, 2], [0, 0], [1, 1], True)),
    Row("inception avg_pool 3x3 s1 p1 288x35x35", "avg_pool2d", (288, 35, 35),
        ([3, 3], [1, 1], [1, 1], False, True, None)),
    Row("vgg adaptive_avg_pool 512x14x14 to 7x7", "adaptive_avg_pool2d", (512, 14, 14), ([7, 7],)),
    Row("densenet window_sum 2x2 128x56x56", "window_sum", (128, 56, 56), ([2, 2], [2, 2])),
    Row("densenet window_sum 2x2 256x28x28", "window_sum", (256, 28, 28), ([2, 2], [2, 2])),
]
AVERAGES = ("avg_pool2d", "adaptive_avg_pool2d")


def scaled(row: Row, quick: bool) -> tuple[tuple[int, int, int], tuple]:
    """The row's [C, H, W] and arguments, with `quick` cut to an eighth (channel counts of the
    gathers with them, an adaptive pool's output size to at most the map's)."""
    if not quick:
        return row.chw, row.args
    c, h, w = (max(1, d // 8) for d in row.chw)
    args = row.args
    if row.op == "channel_gather":
        start, count, groups = args
        args = (start // 8, count // 8, groups)
    elif row.op == "adaptive_avg_pool2d":
        args = ([min(s, d) for s, d in zip(args[0], (h, w), strict=True)],)
    return (c, h, w), args


def out_bytes(op, args: tuple, layout: str) -> int:
    """Bytes the op writes (packed int8, or plain: the window sums' int32), from the output of a
    recording that is never run."""
    with Stream() as stream:
        out = op.record(stream, *args)
    return 4 * layouts.packed_words(out.shape, layout) if out.dtype == torch.int8 else out.nbytes


def copy_rate(nbytes: int, s: Settings) -> float | None:
    """Bytes read + written per second by the faster copy of `nbytes` / 2 bytes: vkCmdCopyBuffer
    and, with CUDA, torch's copy kernel; None without timestamps."""
    half = max(16, nbytes // 2 // 16 * 16)
    seconds = [t for t in (copy_seconds(get_device(), half, s.warmup, s.repeats),
                           cuda_copy_seconds(half, s.repeats, s.warmup)) if t]
    return 2 * half / min(seconds) if seconds else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_row_options(parser)
    options = parser.parse_args()
    started = time.perf_counter()
    caps = open_device()
    if caps is None:
        return 1
    record = Results("q8ta_gather_pool")
    record.device(caps)
    s = Settings.rows(options.quick, options.repeats)
    print("\n== q8ta gathers and pools, median GPU time per call; GB/s = packed bytes of x and out "
          "per second; copy: the same bytes copied (the faster of vkCmdCopyBuffer and torch's copy_ "
          "on CUDA), same run; ratio = our GB/s / the copy's ==")
    print(f"{'shape':<42} {'batch':>5} {'layout':<6} {'GPU us':>9} {'GB/s':>8} {'copy GB/s':>9} {'ratio':>6}")
    only = re.compile(options.only)
    gen = torch.Generator().manual_seed(0)
    for batch in (2, 1) if options.quick else (32, 1):
        for row in SHAPES:
            chw, tail = scaled(row, options.quick)
            x = torch.randint(-128, 128, (batch, *chw), generator=gen, dtype=torch.int8)
            op = runtime.get_op(f"etvk.q8ta_{row.op}.default")
            args = (*QPARAMS, *tail) if row.op in AVERAGES else tail
            yardstick = None
            for layout in PACKED_LAYOUTS:
                if not only.search(f"{row.name} {batch} {layout}"):
                    continue
                device_x = Tensor.from_torch(x, layout=layout)
                moved = 4 * layouts.packed_words(x.shape, layout) + out_bytes(op, (device_x, *args), layout)
                if yardstick is None:
                    yardstick = copy_rate(moved, s)
                    record.kernel("q8ta_gather_pool", f"{row.name} b{batch}", "copy", yardstick and moved / yardstick,
                                  moved)
                timed = time_ours(op, (device_x, *args), moved, s)
                if timed is None or yardstick is None:
                    print("device has no timestamp queries")
                    return 1
                ours = timed[0]
                record.kernel("q8ta_gather_pool", f"{row.name} b{batch}", f"etvk {layout}", ours, moved)
                rate = moved / ours
                print(f"{row.name:<42} {batch:>5} {layout:<6} {ours * 1e6:>9.1f} {rate / 1e9:>8.1f} "
                      f"{fmt(yardstick / 1e9, '.1f', 9)} {rate / yardstick:>6.2f}", flush=True)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
