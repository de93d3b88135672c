"""LLM benchmark (not a test): 8da4w decode of a transformers decoder, ours next to PyTorch CUDA.

Builds a decoder from a preset (default Llama-3.2-1B's shapes, random
weights; ``--layers`` keeps fewer), quantizes it 8da4w (group 32), exports it
with a dynamic token count and a static cache of ``--cache`` positions, lowers
it for 1 and ``--prefill`` tokens a call, saves and loads it, then reports,
measured in the same run:

- ours: decode tokens/s from each of ``--positions`` on (``--repeat`` steps
  at p, p+1, ...: each writes its position and attends to 0..p, the cache
  before p being zeros), from the wall time of ``loaded(...)`` calls (token
  ids in, logits out; the median step) and from the GPU timestamps of one
  call; dispatches per token, and GPU time per op kind;
  where the KV cache lives; prefill: a prompt of ``--prefill`` tokens in one
  call from an empty cache (wall time, median), as `generate` makes it
  (``last_token``: the last-token graph, its final norm and lm_head on the
  last row alone, that row's logits downloaded) and as a plain call (every
  token's logits computed and downloaded), with the GPU time of both graphs
  and per op kind of the last-token graph;
- PyTorch on CUDA (when present), the same architecture with a static cache,
  in bf16 and with torchao's int4 weight-only quantization (group 32, the
  tinygemm ``_weight_int4pack_mm`` kernel): eager and ``torch.compile(mode=
  "reduce-overhead")`` (CUDA graphs), decode one token a call and the same
  prefill;
- the peak host memory of loading the saved file, against its size;
- the streaming floor: the bytes of the program's constants but the
  embedding table (read once a token) over the copy bandwidth measured in
  the same run;
- ``cache_attention`` alone, one layer's decode step at the preset's heads
  over the same cache at each position (GPU time, fp32 as the program runs
  it and fp16): the keys split by the rule (runtime/families/attention.py),
  in chunks of 128 and 256 keys, and in one chunk (one dispatch, the order
  before the split); then one layer's prefill of each of
  ``--attention-prefills`` tokens at positions 0..S-1 (those within the
  cache): the split kernel and the tiled one, each forced through the rule's
  threshold, the tiled one with the rule's lanes a query row, with 1 (one
  invocation a row, the kernel before the lanes), 4 and 8 lanes and with tiles
  of 16 keys, the split/tiled and 1-lane/tiled ratios and the rule's choice.

Usage: ``python benchmarks/llm_bench.py [--preset llama-3.2-1b] [--layers N] [--cache 1280]``
``[--positions 128,1024] [--prefill 512] [--repeat 20] [--warmup 1.0] [--no-torch] [--attention-only]``
``[--attention-prefills 32,64,128,256,512]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from timing import cuda_copy_seconds, drop_validation, median_seconds, open_device, warm  # noqa: E402

import runtime  # noqa: E402
from runtime.families import attention as split_rule  # noqa: E402
from runtime.ops import stub_support  # noqa: E402
from runtime.tools.llm_models import decoder, decoder_config, export_decoder, quantize_8da4w  # noqa: E402
from runtime.vulkan.stream import Stream  # noqa: E402
from runtime.vulkan.tensor import Tensor  # noqa: E402

drop_validation()


def ours(args, path: Path) -> dict:
    loaded = runtime.load(path)
    results = {"homes": sorted(set(loaded.state_placement().values()))}
    rows = loaded.placement()
    results["dispatches"] = sum(len(r["variant"].split("+")) for r in rows if r["variant"])
    results["cpu_nodes"] = sum(r["runs_on"] == "cpu" for r in rows)
    ids = torch.tensor([[7]])

    def step(at: int):
        return loaded(input_ids=ids, cache_position=torch.tensor([at]))

    for position in args.positions:
        # decode steps at position, position + 1, ... (the cache fills as in generation); the
        # warm-up starts over from `position` after a reset every `repeat` steps
        loaded.reset()
        count = 0

        def warm_step(position=position):
            nonlocal count
            if count == args.repeat:
                loaded.reset()
                count = 0
            step(position + count)
            count += 1
        warm(warm_step, args.warmup)
        loaded.reset()
        times = []
        for at in range(position, position + args.repeat):
            start = time.perf_counter()
            step(at)
            times.append(time.perf_counter() - start)
        loaded.reset()
        kinds = defaultdict(float)
        for row in loaded.profile(ids, torch.tensor([position])):
            kinds[row["op"] if row["runs_on"] == "vulkan" else f"cpu: {row['target']}"] += row["seconds"] or 0
        results[position] = (statistics.median(times),
                             sum(s for k, s in kinds.items() if not k.startswith("cpu")), kinds)
    prompt = dict(input_ids=torch.full((1, args.prefill), 7), cache_position=torch.arange(args.prefill))

    for key, call in (("prefill", loaded.last_token), ("prefill_all", loaded)):
        def prefill(call=call):
            loaded.reset()
            call(**prompt)
        results[key] = median_seconds(prefill, max(3, args.repeat // 4), args.warmup)
    # GPU time of the last-token graph (what `last_token` runs) and of the full one
    for key, last in (("prefill_kinds", True), ("prefill_all_kinds", False)):
        loaded.reset()
        kinds = defaultdict(float)
        for row in loaded.profile(*prompt.values(), last_token=last):
            kinds[row["op"] if row["runs_on"] == "vulkan" else f"cpu: {row['target']}"] += row["seconds"] or 0
        results[key] = kinds
    # read once a token: every constant but the embedding tables (one row each)
    tables = {n.args[0].name for n in loaded.program.nodes if n.target == "etvk.embedding.default"}
    results["weight_bytes"] = sum(t.numel() * t.element_size() for name, t in loaded.program.constants.items()
                                  if name not in tables)
    return results


def load_memory(path: Path) -> None:
    """Prints the peak host memory of a fresh process loading the program file on the device,
    less that of one that only imports the runtime, next to the file's size."""
    code = ("import resource, sys, runtime; {} "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    peaks = []
    for body in ("", "runtime.load(sys.argv[1]);"):
        done = subprocess.run([sys.executable, "-c", code.format(body), str(path)], capture_output=True,
                              text=True, check=False)
        if done.returncode:
            print(f"load memory: not measured ({done.stderr.strip().splitlines()[-1:]})")
            return
        peaks.append(int(done.stdout.split()[-1]))
    size = path.stat().st_size
    print(f"loading the file ({size / 2**30:.2f} GiB): peak host memory {(peaks[1] - peaks[0]) / 2**30:.2f} GiB "
          f"above the runtime's import, {(peaks[1] - peaks[0]) / size:.2f}x the file (peaks "
          f"{peaks[0] / 2**30:.2f} and {peaks[1] / 2**30:.2f} GiB)", flush=True)


# The grains (keys per chunk come in whole grains) the attention rows time: the rule's, two
# longer ones, and one no cache reaches (one chunk).
ATTENTION_GRAINS = ((None, "rule"), (128, "grain 128"), (256, "grain 256"), (1 << 30, "one chunk"))


def attention_alone(args) -> None:
    """Prints the GPU time of one layer's cache_attention for one decode token at the preset's
    heads over a cache of ``--cache`` positions, at each of ``--positions`` (recorded once, the
    position a device tensor rewritten before each replay, as a loaded program runs it), per
    dtype and grain of `ATTENTION_GRAINS` ("n/a" where the device has no timestamps); then
    the prefill rows (`attention_prefill`)."""
    config = decoder_config(args.preset)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    op = runtime.get_op("etvk.cache_attention.default")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.float32, torch.float16):
        q = Tensor.from_torch(torch.randn(1, 1, heads, dim, generator=gen).to(dtype))
        k, v = (Tensor.from_torch(torch.randn(1, kv_heads, args.cache, dim, generator=gen).to(dtype))
                for _ in range(2))
        position = Tensor.from_torch(torch.zeros(1, dtype=torch.int32))
        for grain, label in ATTENTION_GRAINS:
            rule_grain = split_rule.CHUNK_GRAIN
            split_rule.CHUNK_GRAIN = grain or rule_grain
            try:
                split = split_rule.attention_split(kv_heads, args.cache)
                with Stream() as stream:
                    op.record(stream, q, k, v, position, dim**-0.5)
                    stream.run()
                    seconds = []
                    for at in args.positions:
                        position.copy_from(torch.tensor([at], dtype=torch.int32))
                        seconds.append(median_seconds_gpu(stream, args.repeat, args.warmup / 4))
            finally:
                split_rule.CHUNK_GRAIN = rule_grain
            rows.append((str(dtype).removeprefix("torch."),
                         f"{label}: {split.chunks} x {min(split.chunk_keys, args.cache)}", seconds))
    print(f"cache_attention alone, one layer and token (Hq {heads}, Hkv {kv_heads}, D {dim}, "
          f"L {args.cache}), GPU us:")
    print(f"  {'dtype':<8}  {'chunks x keys':<22}" + "".join(f"  {'p=' + str(p):>8}" for p in args.positions))
    for dtype, chunks, seconds in rows:
        print(f"  {dtype:<8}  {chunks:<22}" + "".join(
            f"  {s * 1e6:8.1f}" if s is not None else f"  {'n/a':>8}" for s in seconds))
    attention_prefill(args, op, heads, kv_heads, dim)


def attention_prefill(args, op, heads: int, kv_heads: int, dim: int) -> None:
    """Prints the GPU time of one layer's cache_attention for a prefill of each of
    ``--attention-prefills`` tokens (at most ``--cache``) at positions 0..S-1, per dtype: the
    split kernel and the tiled one, each forced through the rule's threshold, the tiled one
    with the rule's tiles and lanes ("tiled"), with 1 lane a row (its variant without
    shuffles: one invocation a row, the kernel before the lanes), 4 and 8 lanes, and with
    tiles of 16 keys (the rule's `TILE_LANES` and `TILE_KEYS` set; the device's subgroups and
    the head dim may halve the lanes, the shared-memory budget the keys); then the split
    kernel's time and the 1-lane one's over the tiled one's, and the kernel the rule picks
    ("n/a" where the device has no timestamps)."""
    gen = torch.Generator().manual_seed(1)
    # column -> (the threshold that forces its kernel, TILE_KEYS, TILE_LANES)
    keys, lanes = split_rule.TILE_KEYS, split_rule.TILE_LANES
    kernels = {"split": (1 << 62, keys, lanes), "tiled": (1, keys, lanes), "tiled l1": (1, keys, 1),
               "tiled l4": (1, keys, 4), "tiled l8": (1, keys, 8), "tiled k16": (1, 16, lanes)}
    print(f"cache_attention prefill alone, one layer (Hq {heads}, Hkv {kv_heads}, D {dim}, L {args.cache}), "
          f"positions 0..S-1, tiled: {stub_support.attention_lanes(dim)} lanes a row, GPU us:")
    print(f"  {'dtype':<8}  {'S':>5}" + "".join(f"  {kernel:>9}" for kernel in kernels) +
          f"  {'split/tiled':>11}  {'l1/tiled':>8}  rule")
    for dtype in (torch.float32, torch.float16):
        k, v = (Tensor.from_torch(torch.randn(1, kv_heads, args.cache, dim, generator=gen).to(dtype))
                for _ in range(2))
        for tokens in (t for t in args.attention_prefills if t <= args.cache):
            q = Tensor.from_torch(torch.randn(1, tokens, heads, dim, generator=gen).to(dtype))
            positions = Tensor.from_torch(torch.arange(tokens, dtype=torch.int32))
            times = {}
            for kernel, setting in kernels.items():
                rule = split_rule.TILED_MIN_TOKENS, split_rule.TILE_KEYS, split_rule.TILE_LANES
                split_rule.TILED_MIN_TOKENS, split_rule.TILE_KEYS, split_rule.TILE_LANES = setting
                try:
                    with Stream() as stream:
                        op.record(stream, q, k, v, positions, dim**-0.5)
                        stream.run()
                        times[kernel] = median_seconds_gpu(stream, args.repeat, args.warmup / 4)
                finally:
                    split_rule.TILED_MIN_TOKENS, split_rule.TILE_KEYS, split_rule.TILE_LANES = rule
            pick = "tiled" if split_rule.attention_tile_keys(tokens, dim) else "split"
            ratios = (f"{times[kernel] / times['tiled']:.2f}" if None not in times.values() else "n/a"
                      for kernel in ("split", "tiled l1"))
            print(f"  {str(dtype).removeprefix('torch.'):<8}  {tokens:>5}" + "".join(
                f"  {seconds * 1e6:9.1f}" if seconds is not None else f"  {'n/a':>9}"
                for seconds in times.values()) + f"  {next(ratios):>11}  {next(ratios):>8}  {pick}")


def median_seconds_gpu(stream: Stream, repeat: int, warmup: float) -> float | None:
    """Median GPU seconds (first dispatch's start to last one's end) of `repeat` replays of
    `stream` after `warmup` seconds of replays; None without timestamps."""
    warm(stream.replay, warmup)
    found = []
    for _ in range(repeat):
        stream.replay()
        found.append(stream.gpu_seconds())
    return None if None in found else statistics.median(found)


def torch_baselines(args, model_source) -> dict:
    """Seconds per decode token and per prefill of the model on CUDA, (weights, mode, position or
    "prefill") -> seconds: bf16 and int4 weight-only weights, eager and compiled (CUDA graphs)."""
    found = {}
    for weights in ("bf16", "int4"):
        try:
            module = _torch_decoder(args, model_source, weights)
        except Exception as error:  # noqa: BLE001  (a baseline that cannot run here is reported)
            print(f"torch {weights}: not built ({type(error).__name__}: {error})"[:300])
            continue
        for mode in ("eager", "compile"):
            calls = {}
            for key in (*args.positions, "prefill"):
                tokens = args.prefill if key == "prefill" else 1
                start = 0 if key == "prefill" else key
                ids = torch.full((1, tokens), 7, device="cuda")
                pos = torch.arange(start, start + tokens, device="cuda")
                # one compiled function per shape: CUDA graphs of static shapes
                fn = module.forward if mode == "eager" else calls.setdefault(
                    tokens, torch.compile(module.forward, mode="reduce-overhead", dynamic=False))

                def call(fn=fn, ids=ids, pos=pos):
                    with torch.no_grad():
                        fn(input_ids=ids, cache_position=pos)
                    torch.cuda.synchronize()
                try:
                    found[(weights, mode, key)] = median_seconds(call, args.repeat, args.warmup)
                    print(f"  torch {weights} {mode} {key}: {found[(weights, mode, key)] * 1e3:.3f} ms", flush=True)
                except Exception as error:  # noqa: BLE001
                    print(f"torch {weights} {mode} {key}: not measured ({type(error).__name__}: {error})"[:300])
        del module
        torch.cuda.empty_cache()
    return found


def _torch_decoder(args, model_source, weights: str):
    """The static-cache module of the model on CUDA in bf16, its linears int4 weight-only for
    ``weights == "int4"``."""
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model = decoder(model_source, num_hidden_layers=args.layers).to("cuda", torch.bfloat16)
    if weights == "int4":
        from torchao.quantization import Int4WeightOnlyConfig, quantize_

        quantize_(model, Int4WeightOnlyConfig(group_size=32, int4_packing_format="tile_packed_to_4d"))
    model.generation_config.cache_implementation = "static"
    # the wrapper's own forward drops cache_position (transformers 5.23): call the static-cache module
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=args.cache).model


def copy_bandwidth() -> float | None:
    """Bytes per second of a device-to-device torch copy (read + written), or None without CUDA."""
    seconds = cuda_copy_seconds(1 << 28, 20, 0.5)
    return None if seconds is None else 2 * (1 << 28) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, help="keep this many layers")
    parser.add_argument("--cache", type=int, default=1280, help="static cache positions (default 1280)")
    parser.add_argument("--positions", default="128,1024", help="decode positions (default 128,1024)")
    parser.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill row (default 512)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch CUDA baselines")
    parser.add_argument("--attention-only", action="store_true",
                        help="time cache_attention alone, without building the model")
    parser.add_argument("--attention-prefills", default="32,64,128,256,512",
                        help="prompt tokens of the prefill rows of cache_attention alone (default 32,64,128,256,512)")
    args = parser.parse_args()
    args.positions = [int(p) for p in args.positions.split(",")]
    args.attention_prefills = [int(t) for t in args.attention_prefills.split(",")]
    if open_device() is None:
        return 1
    if args.attention_only:
        attention_alone(args)
        return 0
    started = time.perf_counter()
    model = quantize_8da4w(decoder(args.preset, num_hidden_layers=args.layers))
    exported = export_decoder(model, args.cache, dynamic=True)
    del model
    program = runtime.lower(exported, token_sizes=[1, args.prefill])
    del exported
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "decoder.etvk"
        program.save(path)
        print(f"{args.preset}" + (f" ({args.layers} layers)" if args.layers else "") +
              f": exported, lowered and saved in {time.perf_counter() - started:.0f} s "
              f"({path.stat().st_size / 2**20:,.0f} MiB, {len(program.nodes)} nodes)")
        del program
        load_memory(path)
        found = ours(args, path)
    print(f"  ours: decode {', '.join(f'p={p} {found[p][0] * 1e3:.3f} ms' for p in args.positions)}; "
          f"prefill {found['prefill'] * 1e3:.2f} ms (all logits {found['prefill_all'] * 1e3:.2f})", flush=True)
    baselines = torch_baselines(args, args.preset) if torch.cuda.is_available() and not args.no_torch else {}
    bandwidth = copy_bandwidth()
    print(f"KV cache in {'/'.join(found['homes'])} memory; {found['dispatches']} dispatches and "
          f"{found['cpu_nodes']} CPU nodes per token; {found['weight_bytes'] / 1e9:.3f} GB of constants")
    floor = found["weight_bytes"] / bandwidth if bandwidth else None

    def rate(seconds):
        return f"{1 / seconds:,.1f}" if seconds else "n/a"
    columns = [(w, m) for w in ("bf16", "int4") for m in ("eager", "compile")]
    print(f"{'position':>8}  {'ours tok/s':>10}  {'ours GPU':>9}" +
          "".join(f"  {w + ' ' + m:>13}" for w, m in columns) + f"  {'floor':>7}  ours / int4 compile")
    for position in args.positions:
        wall, gpu, _ = found[position]
        best = baselines.get(("int4", "compile", position))
        ratio = f"{best / wall:.2f}" if best else "n/a"
        print(f"{position:>8}  {rate(wall):>10}  {rate(gpu):>9}" +
              "".join(f"  {rate(baselines.get((w, m, position))):>13}" for w, m in columns) +
              f"  {rate(floor):>7}  {ratio}")

    def ms(seconds):
        return f"{seconds * 1e3:.2f}" if seconds else "n/a"
    bf16 = baselines.get(("bf16", "compile", "prefill"))
    print(f"prefill of {args.prefill} tokens, ms: ours {ms(found['prefill'])} (every token's logits to "
          f"the host: {ms(found['prefill_all'])})" +
          "".join(f"; {w} {m} {ms(baselines.get((w, m, 'prefill')))}" for w, m in columns) +
          (f"; ours / bf16 compile {found['prefill'] / bf16:.2f}" if bf16 else ""))
    print(f"prefill GPU time, ms: last-token graph {ms(sum(found['prefill_kinds'].values()))}, full graph "
          f"{ms(sum(found['prefill_all_kinds'].values()))}")
    for position in (*args.positions, "prefill"):
        kinds = found["prefill_kinds"] if position == "prefill" else found[position][2]
        total = sum(kinds.values()) or 1.0
        print(f"time per op kind at position {position} (GPU timestamps; CPU nodes: wall):"
              if position != "prefill" else
              f"time per op kind, prefill of {args.prefill} tokens, last-token graph (GPU timestamps, "
              f"{total * 1e3:.2f} ms "
              "in all; the rest of the call's wall time is the host's: uploads, logits download):")
        for kind, seconds in sorted(kinds.items(), key=lambda kv: -kv[1])[:12]:
            print(f"  {kind:<48} {seconds * 1e6:10.1f} us  {100 * seconds / total:5.1f} %")
    attention_alone(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
