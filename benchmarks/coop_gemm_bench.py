"""Cooperative-matrix int8 GEMM benchmark (not a test): q8ta_gemm_coop against the sdot GEMM and cuDNN.

Rows, all in one run:

- batch-32 ResNet-50 and MobileNetV2 stems (3 input channels) and ResNet-50 3x3 layers
  through im2col (``etvk.q8ta_conv2d_im2col_coop`` against
  ``etvk.q8ta_conv2d_im2col``, whose GEMM is the int8 dot-product variant) and 1x1 layers
  through the pointwise GEMM (``..._pw_coop`` against ``..._pw``), next to cuDNN fp16
  (channels_last, ``cudnn.benchmark``);
- a plain int8 GEMM M x K x N = 4096^3 through the same shaders (a 1x1 conv of 4096 pixels,
  4096 input and 4096 output channels), next to ``torch._int_mm`` (int8 x int8 -> int32 on
  CUDA).

Timing follows conv2d_bench.py (whose helpers it uses): x is uploaded once, a recorded stream
of back-to-back calls is warmed, then replayed; a call's GPU time is the sum of its
dispatches' timestamps (im2col included). TOPS = 2 * MACs / seconds; ratios are GPU time
ratios (< 1: coop faster). Where the device lacks the coop variant its column says why and the
rest still runs; without CUDA the baselines print "n/a". About a minute on an H100.

Usage: ``python benchmarks/coop_gemm_bench.py [--quick] [--only REGEX] [--layout 4C]``
(``--quick``: tiny sizes, batch 2, short warm-up; runs on lavapipe. ``--layout``: the packed
layout x goes up in, 4C by default; the coop GEMMs stage a 4C input with C_in % 16 == 0 16
bytes at a time, any other 4 bytes at a time.)
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conv2d_bench import Settings, fmt, time_cudnn, time_ours, tops  # noqa: E402
from timing import drop_validation, open_device, time_cuda  # noqa: E402

import runtime  # noqa: E402
from runtime.ops.library import catalog  # noqa: E402
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs  # noqa: E402
from runtime.vulkan.layouts import PACKED_LAYOUTS  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

drop_validation()

C = Conv2dCase
BATCH = 32
LAYERS = [
    # The stems: 3 input channels, one channel word per tap (K = 49 x 4 and 9 x 4 bytes).
    C("resnet50 stem 7x7/2 3->64 224", BATCH, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3),
      activation="relu"),
    C("mbv2 stem 3x3/2 3->32 224", BATCH, 3, 224, 224, 32, (3, 3), (2, 2), (1, 1),
      activation="hardtanh"),
    C("resnet50 l1 3x3 64->64 56", BATCH, 64, 56, 56, 64, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l2 3x3 128->128 28", BATCH, 128, 28, 28, 128, (3, 3), padding=(1, 1),
      activation="relu"),
    C("resnet50 l3 3x3 256->256 14", BATCH, 256, 14, 14, 256, (3, 3), padding=(1, 1),
      activation="relu"),
    C("resnet50 l4 3x3 512->512 7", BATCH, 512, 7, 7, 512, (3, 3), padding=(1, 1), activation="relu"),
    C("resnet50 l1 1x1 256->64 56", BATCH, 256, 56, 56, 64, (1, 1), activation="relu"),
    C("resnet50 l1 1x1 64->256 56", BATCH, 64, 56, 56, 256, (1, 1)),
    C("resnet50 l3 1x1 1024->256 14", BATCH, 1024, 14, 14, 256, (1, 1), activation="relu"),
    C("resnet50 l4 1x1 512->2048 7", BATCH, 512, 7, 7, 2048, (1, 1)),
]
GEMM = C("int8 GEMM 4096x4096x4096", 1, 4096, 64, 64, 4096, (1, 1), bias=False)
COOP_VARIANT = "q8ta_gemm_coop_k64_w4"  # runs wherever every coop GEMM variant runs
# kind -> (coop op, existing op); x goes up in 4C unless --layout says otherwise, the layout
# both read best
OPS = {"im2col": ("etvk.q8ta_conv2d_im2col_coop.default", "etvk.q8ta_conv2d_im2col.default"),
       "pw": ("etvk.q8ta_conv2d_pw_coop.default", "etvk.q8ta_conv2d_pw.default")}


def quick_case(case: Conv2dCase) -> Conv2dCase:
    """A tiny version of `case` for CPU drivers: batch 2, an eighth of the size (at least 4)."""
    h, w = max(4, case.H // 8), max(4, case.W // 8)
    c_in = case.C_in if case.C_in < 1024 else 256
    c_out = case.C_out if case.C_out < 1024 else 256
    return dataclasses.replace(case, name=f"{case.name} @{h}", N=2, H=h, W=w, C_in=c_in, C_out=c_out)


def time_op(name: str, case: Conv2dCase, s: Settings, layout: str):
    """(GPU seconds per call, GEMM variant) of op `name` on the case, x uploaded in `layout`."""
    p = case.params
    inputs = make_inputs(case)
    args = list(inputs.args())
    args[0] = Tensor.from_torch(inputs.x, layout=layout, label=f"{case.name} x")
    call_bytes = p.N * p.C_out * p.H_out * p.W_out + p.N * p.gemm_k * p.H_out * p.W_out
    measured = time_ours(runtime.get_op(name), tuple(args), call_bytes, s)
    if measured is None:
        sys.exit("device has no timestamp queries: nothing to time")
    seconds, _, variants = measured
    return seconds, variants[-1]


def time_int_mm(case: Conv2dCase, s: Settings) -> float | None:
    """Median seconds of ``torch._int_mm`` on the GEMM of a 1x1 case, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    p = case.params
    m = p.N * p.H * p.W
    a = torch.randint(-128, 128, (m, p.C_in), dtype=torch.int8, device="cuda")
    b = torch.randint(-128, 128, (p.C_in, p.C_out), dtype=torch.int8, device="cuda")
    return time_cuda(lambda _: torch._int_mm(a, b), 1, s.repeats * s.max_calls, s.warmup)


def bench(case: Conv2dCase, kind: str, s: Settings, coop_reason: str, gemm: bool, layout: str) -> None:
    """Times one row, x in `layout`: coop, sdot, and cuDNN (or torch._int_mm where `gemm`);
    prints it."""
    coop_op, dot_op = OPS[kind]
    macs = case.macs
    rows = {}
    for label, name in (("coop", coop_op), ("sdot", dot_op)):
        if label == "coop" and coop_reason:
            continue
        try:
            rows[label] = time_op(name, case, s, layout)
        except runtime.EtvkError as error:
            print(f"{case.name:<32} {label}: failed: {error}")
    try:
        base = time_int_mm(case, s) if gemm else time_cudnn(case, s)
    except RuntimeError as error:  # e.g. out of memory: report, keep going
        print(f"  (baseline failed on {case.name}: {str(error).splitlines()[0]})")
        base = None
    coop = rows.get("coop", (None, ""))[0]
    dot = rows.get("sdot", (None, ""))[0]
    variant = rows.get("sdot", (None, "-"))[1]
    print(f"{case.name:<32} {kind:<6} {fmt(coop and coop * 1e6, '.1f', 9)} "
          f"{fmt(tops(macs, coop), '.1f', 6)} {fmt(dot and dot * 1e6, '.1f', 9)} "
          f"{fmt(tops(macs, dot), '.1f', 6)} {variant:<18} {fmt(base and base * 1e6, '.1f', 9)} "
          f"{fmt(tops(macs, base), '.1f', 6)} {fmt(coop and dot and coop / dot, '.2f', 10)} "
          f"{fmt(coop and base and coop / base, '.2f', 10)}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, short warm-up (CPU drivers)")
    parser.add_argument("--only", default="", help="regular expression on the row's name")
    parser.add_argument("--layout", default="4C", choices=PACKED_LAYOUTS,
                        help="the packed layout x is uploaded in (default 4C)")
    options = parser.parse_args()
    started = time.perf_counter()
    caps = open_device()
    if caps is None:
        return 1
    ok, reason = catalog().variant(COOP_VARIANT).runnable(caps)
    coop_reason = "" if ok else reason
    s = Settings(repeats=3, warmup=0.05, max_calls=2) if options.quick else \
        Settings(repeats=10, warmup=0.3, max_calls=4)
    print("\n== int8 GEMM on cooperative matrices (q8ta_gemm_coop*) vs the int8 dot-product GEMM "
          f"vs cuDNN fp16 / torch._int_mm; x in {options.layout}; median GPU time per call ==")
    if coop_reason:
        print(f"coop: not run here: {coop_reason}")
    print(f"{'layer':<32} {'via':<6} {'coop us':>9} {'TOPS':>6} {'sdot us':>9} {'TOPS':>6} "
          f"{'(variant)':<18} {'base us':>9} {'TOPS':>6} {'coop/sdot':>10} {'coop/base':>10}")
    only = re.compile(options.only)
    for case in [*LAYERS, GEMM]:
        if not only.search(case.name):
            continue
        kind = "pw" if case.params.is_pointwise else "im2col"
        bench(quick_case(case) if options.quick else case, kind, s, coop_reason, case is GEMM,
              options.layout)
    print("base: cuDNN fp16 channels_last for the layers, torch._int_mm for the GEMM")
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
