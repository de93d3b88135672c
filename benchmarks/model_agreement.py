"""Agreement of a lowered torchvision model with PyTorch's own PT2E int8 graph: output SQNR.

The model is built with random weights (`runtime.tools.models.torchvision_model`), its batch
norms' statistics measured on random batches and quantized with PT2E exactly as
tests/runtime/programs/test_models.py does (seeds included), lowered, and its CPU reference run
(`Program.run_reference`, which the device run equals bit for bit) compared with the exported
int8 graph's run on random inputs. Per input, SQNR in dB of:

- ``ours/PT``: our logits against PyTorch's int8 graph's;
- ``PT64/PT``: PyTorch's int8 graph run with its float convolutions and matmuls computed in
  float64 and rounded to float32 (`Float64Products`; the quantize and dequantize ops and all else
  unchanged) against the same graph run as is, whose convs accumulate the dequantized values in
  fp32 in oneDNN's order;
- ``ours/PT64``: our logits (exact int32 sums) against that float64 run;
- ``PT/fp32``: PyTorch's int8 logits against the fp32 model's, for scale.

If the disagreement comes from the fp32 accumulation order, ``PT64/PT`` is about as low as
``ours/PT`` and ``ours/PT64`` is much higher. The ops run in float64 are printed once. Not
timed; runs on the CPU (DenseNet-121 at 32x32 takes a minute or two).

    python benchmarks/model_agreement.py densenet121 --size 32
"""

from __future__ import annotations

import argparse

import torch

import runtime
from runtime.tools.float64_products import Float64Products
from runtime.tools.models import quantize_pt2e, torchvision_model, with_batch_statistics


def _batches(count: int, shape, seed: int = 0) -> list[tuple[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(shape, generator=gen),) for _ in range(count)]


def _sqnr_db(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    noise = (ours.double() - theirs.double()).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(theirs.double().pow(2).sum() / noise))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a torchvision model name, e.g. densenet121")
    parser.add_argument("--size", type=int, default=32, help="input height and width")
    parser.add_argument("--inputs", type=int, default=2, help="random inputs compared")
    args = parser.parse_args()
    torch.manual_seed(0)
    shape = (1, 3, args.size, args.size)
    model = with_batch_statistics(torchvision_model(args.model), _batches(2, (8, *shape[1:]), seed=3))
    exported = quantize_pt2e(model, _batches(1, shape)[0], _batches(2, shape, seed=1))
    program = runtime.lower(exported)
    cpu = sorted({n.target for n in program.nodes if not n.target.startswith("etvk.")})
    print(f"{args.model} {args.size}x{args.size}: nodes not lowered to etvk ops: {cpu or 'none'}")
    graph = exported.module()
    for index, (x,) in enumerate(_batches(args.inputs, shape, seed=13)):
        ours, theirs = program.run_reference(x), graph(x)
        with Float64Products() as fp64:
            theirs64 = graph(x)
        with torch.no_grad():
            fp32 = model(x)
        if index == 0:
            print("float64 in PT64: " + ", ".join(f"{op} x{n}" for op, n in sorted(fp64.counts.items())))
        print(f"input {index}: ours/PT {_sqnr_db(ours, theirs):.1f} dB "
              f"(logits equal {int((ours == theirs).sum())}/{theirs.numel()}), "
              f"PT64/PT {_sqnr_db(theirs64, theirs):.1f} dB, "
              f"ours/PT64 {_sqnr_db(ours, theirs64):.1f} dB "
              f"(logits equal {int((ours == theirs64).sum())}/{theirs.numel()}), "
              f"PT/fp32 {_sqnr_db(theirs, fp32):.1f} dB")


if __name__ == "__main__":
    main()
