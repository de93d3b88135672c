"""GPU probe (not a test, not a benchmark to keep): DenseNet-121's per-channel tables folded into
the 1x1 conv that reads them (q8ta_conv2d's input_table), against the two ops it replaces.

Kernels (default): for DenseNet-121's 1x1 convs at batch 1 and 32 (dense layers C_in 64..992
step 32 -> 128 at 56/28/14/7, transitions 256 -> 128, 512 -> 256, 1024 -> 512), each pointwise
GEMM the device runs (pw, and pw_coop where it runs cooperative matrices), input in 4C:
``table`` (q8ta_channel_lut alone), ``conv`` (the plain conv), ``folded`` (the conv with the
tables), all three in one recorded stream, median GPU timestamps per call over replays; the
ratio is folded / (table + conv) (below 1: the fold wins), and folded / conv is what the
lookups cost the GEMM. Usage:

    python gpu_probe/lut_in.py [--batches 1,32] [--only REGEX] [--warmup 0.3] [--replays 20]

Programs: ``--export-unfolded FILE [--batch B]`` writes DenseNet-121 lowered with the fold
turned off (the same model, seed and calibration as ``python -m runtime export densenet121
--batch B --out FILE``), so that benchmarks/program_bench.py times both in one run:

    python -m runtime export densenet121 --batch 1 --out dn_b1.etvk
    python gpu_probe/lut_in.py --export-unfolded dn_b1_unfolded.etvk --batch 1
    python benchmarks/program_bench.py densenet121:dn_b1.etvk densenet121:dn_b1_unfolded.etvk --slowest 12
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import drop_validation, open_device, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.ops.stub_support import coop_gemm_kernels  # noqa: E402
from runtime.programs import lower_conv_in_table  # noqa: E402
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

CALLS = 4  # back-to-back calls of each op per recorded stream


def densenet121_pointwise(batch: int) -> list[Conv2dCase]:
    """DenseNet-121's 1x1 convs: each block's dense layers (C_in grows by 32, C_out 128), then
    its transition (C_in -> C_in / 2)."""
    cases = []
    for size, first, layers in ((56, 64, 6), (28, 128, 12), (14, 256, 24), (7, 512, 16)):
        for i in range(layers):
            c_in = first + 32 * i
            cases.append(Conv2dCase(f"dense c{c_in} @{size}", batch, c_in, size, size, 128, (1, 1)))
        if size != 7:
            c_in = first + 32 * layers
            cases.append(Conv2dCase(f"transition c{c_in} @{size}", batch, c_in, size, size, c_in // 2, (1, 1)))
    return cases


def time_three(case: Conv2dCase, algorithm: str, warmup: float, replays: int) -> tuple[float, float, float]:
    """Median GPU seconds of one call of (table op, plain conv, folded conv) on the case."""
    inp = make_inputs(case)
    table = torch.randint(-128, 128, (case.C_in, 256), generator=torch.Generator().manual_seed(1),
                          dtype=torch.int8)
    conv = runtime.get_op(f"etvk.q8ta_conv2d_{algorithm}.default")
    lut = runtime.get_op("etvk.q8ta_channel_lut.default")
    with Stream() as stream:
        x = Tensor.from_torch(inp.x, layout="4C")
        device_table = Tensor.from_torch(table)
        for _ in range(CALLS):
            lut.record(stream, x, device_table)
        for _ in range(CALLS):
            conv.record(stream, x, *inp.args()[1:])
        for _ in range(CALLS):
            conv.record(stream, x, *inp.args()[1:], input_table=device_table)
        stream.run()
        per_call = len(stream.timings()) // (3 * CALLS)
        warm(stream.replay, warmup)
        totals = [[], [], []]
        for _ in range(replays):
            stream.replay()
            seconds = [t for _, t in stream.timings()]
            for i in range(3 * CALLS):
                totals[i // CALLS].append(sum(seconds[i * per_call:(i + 1) * per_call]))
    return tuple(statistics.median(t) for t in totals)


def kernels(args) -> int:
    caps = open_device()
    if caps is None:
        return 1
    algorithms = ["pw"] + (["pw_coop"] if "pw" in coop_gemm_kernels(caps) else [])
    only = re.compile(args.only)
    print(f"{'shape':>22} {'N':>3} {'alg':>7} {'table us':>9} {'conv us':>8} {'folded us':>9} "
          f"{'folded/(table+conv)':>20} {'folded/conv':>11}")
    sums = {a: [0.0, 0.0, 0.0] for a in algorithms}
    for batch in (int(b) for b in args.batches.split(",")):
        for case in densenet121_pointwise(batch):
            if not only.search(case.name):
                continue
            for algorithm in algorithms:
                t, c, f = time_three(case, algorithm, args.warmup, args.replays)
                for i, v in enumerate((t, c, f)):
                    sums[algorithm][i] += v
                print(f"{case.name:>22} {batch:>3} {algorithm:>7} {t * 1e6:9.1f} {c * 1e6:8.1f} {f * 1e6:9.1f} "
                      f"{f / (t + c):20.3f} {f / c:11.3f}", flush=True)
    for algorithm, (t, c, f) in sums.items():
        if c:
            print(f"total {algorithm}: table {t * 1e6:.1f} us + conv {c * 1e6:.1f} us -> folded {f * 1e6:.1f} us "
                  f"({f / (t + c):.3f}x; folded / conv {f / c:.3f})")
    return 0


def export_unfolded(args) -> int:
    from runtime.tools.program_commands import export

    with mock.patch.object(lower_conv_in_table, "fold_input_tables", lambda rw: None):
        return export("densenet121", args.export_unfolded, 224, args.batch, 4, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--only", default="", help="a regex on the shape names, e.g. '@56'")
    parser.add_argument("--warmup", type=float, default=0.3, help="seconds of replays before timing")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--export-unfolded", type=Path, help="write DenseNet-121 lowered without the fold")
    parser.add_argument("--batch", type=int, default=1, help="the batch of --export-unfolded")
    args = parser.parse_args()
    if args.export_unfolded:
        return export_unfolded(args)
    drop_validation()
    return kernels(args)


if __name__ == "__main__":
    sys.exit(main())
