"""GPU probe (not a test): the tiled prefill attention's lanes a row and rows a workgroup.

One Llama-3.2-1B attention layer (Hq 32, Hkv 8, D 64, a 1280-position cache), a prefill
of S tokens at positions 0..S-1, fp32 and fp16, GPU µs (median of replays), all in one run:

- split: the split kernel (the rule's threshold forced up);
- l1 w64: the tiled kernel one row per invocation (its variant without shuffles; the kernel
  before the lanes);
- l<N> w<W>: the shuffle variant with N lanes a row in workgroups of W invocations, W / N
  rows each; l4 w64 is the rule's (16 rows). The others dispatch the same SPIR-V with
  another workgroup size (the shader takes any multiple of the subgroup size).

Every tiled output is compared with the split kernel's: the column `err` is the largest
difference over `attention_tolerance` (the two are each within it of the exact result, so
anything under 2 is right). Read: the rule's l4 w64 against l1 w64 (the lanes' gain) and
against split (where the rule's TILED_MIN_TOKENS should sit), and l4 w64 against l4 w256
(16 rows a workgroup against 64: more workgroups against less staging).

Usage: ``python gpu_probe/attn_lanes.py [--tokens 32,64,128,256,512] [--repeat 20] [--small]``
(``--small``: Hq 4, Hkv 2, D 64, cache 64, tokens 8,32: a lavapipe smoke run). A column
whose lanes do not divide D / 4 or the device's smallest subgroup reads n/a.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from timing import drop_validation, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.families import attention as rule  # noqa: E402
from runtime.ops.library import catalog  # noqa: E402
from runtime.ops.stub_support import attention_lanes  # noqa: E402
from runtime.reference.attention import attention_tolerance  # noqa: E402
from runtime.vulkan.device import get_device  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

# (lanes, workgroup invocations) of the shuffle variant's columns
SHAPES = ((4, 64), (4, 128), (4, 256), (2, 64), (2, 128), (8, 64), (8, 256))


def gpu_us(stream: Stream, repeat: int) -> float | None:
    """Median GPU µs of `repeat` replays after 0.2 s of them; None without timestamps."""
    warm(stream.replay, 0.2)
    found = []
    for _ in range(repeat):
        stream.replay()
        found.append(stream.gpu_seconds())
    return None if None in found else statistics.median(found) * 1e6


def through_op(args, threshold: int, lanes: int, repeat: int):
    """(µs, output) of the op with the rule's threshold and lanes set."""
    op = runtime.get_op("etvk.cache_attention.default")
    saved = rule.TILED_MIN_TOKENS, rule.TILE_LANES
    rule.TILED_MIN_TOKENS, rule.TILE_LANES = threshold, lanes
    try:
        with Stream() as stream:
            out = op.record(stream, *args)
            stream.run()
            return gpu_us(stream, repeat), out.to_torch()
    finally:
        rule.TILED_MIN_TOKENS, rule.TILE_LANES = saved


def direct(args, dtype: str, lanes: int, workgroup: int, repeat: int):
    """(µs, output) of the shuffle variant dispatched with `lanes` lanes a row in workgroups
    of `workgroup` invocations."""
    q, k, v, positions, scale = args
    _, tokens, heads, dim = q.shape
    kv_heads, cache = k.shape[1], k.shape[2]
    group = heads // kv_heads
    variant = catalog().variant(f"cache_attention_tiled_{dtype}_shuffle")
    variant = dataclasses.replace(variant, interface=dataclasses.replace(
        variant.interface, workgroup=(workgroup, 1, 1)))
    blocks = -(-tokens * group // (workgroup // lanes))
    groups = kv_heads * blocks
    out = Tensor.from_torch(torch.zeros(q.shape, dtype=q.dtype))
    with Stream() as stream:
        stream.dispatch(variant, "gpu_probe", bindings={"t_out": out, "t_q": q, "t_k": k, "t_v": v,
                                                        "t_positions": positions},
                        push={"sizes": [tokens, heads, kv_heads, cache], "blocks": blocks,
                              "groups": groups, "scale": scale},
                        spec_constants={"GROUP": group, "HEAD_UNITS": dim // 4,
                                        "TILE_KEYS": rule.attention_tile_keys(max(tokens, rule.TILED_MIN_TOKENS), dim),
                                        "LANES": lanes},
                        groups=[groups, 1, 1])
        stream.run()
        return gpu_us(stream, repeat), out.to_torch()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="32,64,128,256,512")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    drop_validation()
    heads, kv_heads, dim, cache = (4, 2, 64, 64) if args.small else (32, 8, 64, 1280)
    tokens_list = [8, 32] if args.small else [int(t) for t in args.tokens.split(",")]
    device = get_device().caps
    smallest = min(device.subgroup_size_range or (device.subgroup_size,))
    print(f"{device.name}: Hq {heads}, Hkv {kv_heads}, D {dim}, L {cache}, positions 0..S-1, GPU us "
          f"(subgroup {device.subgroup_size}, rule: {attention_lanes(dim)} lanes)")
    columns = ["split", "l1 w64"] + [f"l{n} w{w}" for n, w in SHAPES]
    print(f"  {'dtype':<8} {'S':>5}" + "".join(f" {c:>9}" for c in columns) + f" {'err':>6}")
    gen = torch.Generator().manual_seed(3)
    for dtype, torch_dtype in (("float", torch.float32), ("half", torch.float16)):
        k_host, v_host = (torch.randn(1, kv_heads, cache, dim, generator=gen).to(torch_dtype) for _ in range(2))
        k, v = Tensor.from_torch(k_host), Tensor.from_torch(v_host)
        for tokens in tokens_list:
            q_host = torch.randn(1, tokens, heads, dim, generator=gen).to(torch_dtype)
            positions_host = torch.arange(tokens, dtype=torch.int32)
            scale = dim**-0.5
            tol = attention_tolerance(q_host, k_host, v_host, positions_host, scale)
            device_args = (Tensor.from_torch(q_host), k, v, Tensor.from_torch(positions_host), scale)
            times = {}
            times["split"], want = through_op(device_args, 1 << 62, rule.TILE_LANES, args.repeat)
            outs = []
            times["l1 w64"], out = through_op(device_args, 1, 1, args.repeat)
            outs.append(out)
            for n, w in SHAPES:
                if (dim // 4) % n or smallest % n:  # the lanes must divide the units and subgroups
                    times[f"l{n} w{w}"] = None
                    continue
                times[f"l{n} w{w}"], out = direct(device_args, dtype, n, w, args.repeat)
                outs.append(out)
            err = max(float((o.double() - want.double()).abs().max()) for o in outs) / tol
            print(f"  {dtype:<8} {tokens:>5}" + "".join(
                f" {times[c]:9.1f}" if times[c] is not None else f" {'n/a':>9}" for c in columns)
                + f" {err:6.3f}", flush=True)


if __name__ == "__main__":
    main()
