"""Memory traffic of a lowered torchvision model by op, from its value shapes (not timed; CPU).

The model is built and quantized as benchmarks/model_agreement.py does (random weights, batch
norm statistics measured on random batches, PT2E), at the given input size and batch (one random
calibration batch of that shape), and lowered; for each op target the nodes' count and the bytes
they read and write: every tensor argument and output once, its elements times their size
(int8 1, int32 and fp32 4; a packed layout's padding not counted), the activations apart from
the constants (a table op's tables counted whole). Rows whose target matches ``--ops`` are
summed at the end.

    python benchmarks/program_traffic.py densenet121 --size 224 --batch 32 --ops "concat|channel_lut|avg_pool2d"
"""

from __future__ import annotations

import argparse
import math
import re
from collections import defaultdict

import torch

import runtime
from runtime.programs.nodes import Const, Ref, walk_args
from runtime.tools.models import quantize_pt2e, torchvision_model, with_batch_statistics


def _value_bytes(program, name: str) -> int:
    spec = program.values[name]
    return math.prod(spec.shape) * spec.dtype.itemsize


def traffic(program) -> dict[str, list[int]]:
    """target -> [nodes, activation bytes read, constant bytes read, bytes written]."""
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for node in program.nodes:
        row = rows[node.target]
        row[0] += 1
        for arg in dict.fromkeys(a for a in walk_args((node.args, node.kwargs)) if isinstance(a, (Ref, Const))):
            if isinstance(arg, Const):
                row[2] += program.constants[arg.name].nbytes
            else:
                row[1] += _value_bytes(program, arg.name)
        row[3] += sum(_value_bytes(program, o) for o in node.outputs)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a torchvision model name, e.g. densenet121")
    parser.add_argument("--size", type=int, default=224, help="input height and width")
    parser.add_argument("--batch", type=int, default=1, help="the program's batch")
    parser.add_argument("--ops", default="", help="a regex: the targets summed at the end")
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    stats = [(torch.randn(8, 3, args.size, args.size, generator=gen),) for _ in range(2)]
    model = with_batch_statistics(torchvision_model(args.model), stats)
    example = (torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(1)),)
    program = runtime.lower(quantize_pt2e(model, example, [example]))
    rows = traffic(program)
    print(f"{args.model} {args.size}x{args.size} batch {args.batch}: {len(program.nodes)} nodes")
    print(f"{'target':48} {'nodes':>6} {'read MB':>10} {'consts MB':>10} {'written MB':>11}")
    total = [0, 0, 0, 0]
    for target, row in sorted(rows.items(), key=lambda kv: -(kv[1][1] + kv[1][3])):
        print(f"{target:48} {row[0]:6d} {row[1] / 1e6:10.1f} {row[2] / 1e6:10.1f} {row[3] / 1e6:11.1f}")
        if args.ops and re.search(args.ops, target):
            total = [t + r for t, r in zip(total, row, strict=True)]
    if args.ops:
        print(f"{'sum of /' + args.ops + '/':48} {total[0]:6d} {total[1] / 1e6:10.1f} {total[2] / 1e6:10.1f} "
              f"{total[3] / 1e6:11.1f}; read + written {(total[1] + total[2] + total[3]) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
