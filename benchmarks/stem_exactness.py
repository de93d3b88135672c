"""Stem check (not a test; for a GPU): the stems at full size on every im2col algorithm, bit-exact.

ResNet-50's 7x7/2 3->64 and MobileNetV2's 3x3/2 3->32 stems at 224x224, batch 1 and 32,
through the dispatcher (the rule's pick printed), im2col_coop (where the device runs it),
im2col and the direct conv, each compared bit for bit with the reference (CPU, float64
sums). The pytest cases (tests/ops/test_conv2d_stem.py) are small; this checks the real
tile counts and K chunks. Prints one line per run and "ALL EXACT" at the end.

Usage: ETVK_VALIDATION=0 python benchmarks/stem_exactness.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runtime  # noqa: E402
from runtime.ops.stub_support import conv2d_algorithm, coop_gemm_kernels  # noqa: E402
from runtime.reference import conv2d as ref  # noqa: E402
from runtime.tools.examples_conv2d import Conv2dCase, make_inputs  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402

STEMS = [
    Conv2dCase("resnet50 stem 7x7/2 3->64", 1, 3, 224, 224, 64, (7, 7), (2, 2), (3, 3), activation="relu"),
    Conv2dCase("mbv2 stem 3x3/2 3->32", 1, 3, 224, 224, 32, (3, 3), (2, 2), (1, 1), activation="hardtanh"),
]
OPS = {"dispatcher": "etvk.q8ta_conv2d.default", "im2col_coop": "etvk.q8ta_conv2d_im2col_coop.default",
       "im2col": "etvk.q8ta_conv2d_im2col.default", "general": "etvk.q8ta_conv2d_general.default"}


def main() -> int:
    caps = get_device().caps
    coop = coop_gemm_kernels(caps)
    print(f"device: {caps.name} (family {caps.family}); coop GEMM kernels: {sorted(coop) or 'none'}")
    bad = 0
    for stem in STEMS:
        for batch in (1, 32):
            case = Conv2dCase(**{**stem.__dict__, "N": batch})
            inp = make_inputs(case)
            started = time.perf_counter()
            want = ref.q8ta_conv2d(*inp.args())
            ref_s = time.perf_counter() - started
            print(f"{case.name} b{batch}: rule picks {conv2d_algorithm(case.params)} "
                  f"(K {case.params.gemm_k} bytes; reference {ref_s:.1f} s)")
            for short, name in OPS.items():
                if short == "im2col_coop" and "im2col" not in coop:
                    print(f"  {short:<12} skipped: the device does not run it")
                    continue
                got = runtime.get_op(name)(*inp.args())
                exact = torch.equal(got, want)
                bad += not exact
                diff = (got.to(torch.int32) - want.to(torch.int32)).abs()
                print(f"  {short:<12} {'exact' if exact else 'DIFFERS'}: {int((diff > 0).sum())} of "
                      f"{diff.numel()} outputs differ, worst {int(diff.max())}", flush=True)
    print("ALL EXACT" if not bad else f"{bad} RUNS DIFFER")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
