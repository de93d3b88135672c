"""The benchmarks run to their end at tiny sizes on the test device; runtime_bench and
conv2d_bench under every GPU family (ETVK_GPU_FAMILY): a benchmark must not depend on the family's
routing (one forced a variant of a route the nvidia family does not take). The figures themselves
are not checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runtime.tools.quantize_tunables import CHOOSE_CANDIDATES, DYNAMIC_CANDIDATES
from runtime.vulkan.device import GPU_FAMILIES

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(args: list[str], family: str, results: Path):
    env = dict(os.environ, ETVK_GPU_FAMILY=family, ETVK_VALIDATION="0", ETVK_BENCH_RESULTS=str(results))
    return subprocess.run([sys.executable, *args], cwd=BENCHMARKS.parent, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_runtime_bench_runs_on_every_family(family, tmp_path):
    result = _run([str(BENCHMARKS / "runtime_bench.py"), "--quick",
                   "--only", "quantize_per_tensor_buffer_float_int8$"], family, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"(family {family})" in result.stdout and "quantize_per_tensor_buffer_float_int8" in result.stdout
    records = [json.loads(line) for line in (tmp_path / "runtime.jsonl").read_text().splitlines()]
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "device" and kinds.count("overhead") == 16
    # where CUDA runs too (the GPU machine), its copy kernel and quantize are records as well
    cuda = torch.cuda.is_available()
    assert [r["how"] for r in records if r["kind"] == "copy"] == \
        ["vkCmdCopyBuffer"] + ["torch CUDA copy_"] * cuda
    assert [r["impl"] for r in records if r["kind"] == "kernel"] == ["etvk"] + ["torch CUDA"] * cuda
    assert {r["case"] for r in records if r["kind"] == "kernel"} == {"quantize_per_tensor_buffer_float_int8"}
    assert "100 small dispatches recorded, replayed" in result.stdout
    assert result.stdout.count("the same, recorded afresh (ETVK_REUSE_RECORDINGS=0)") == 2


def test_runtime_bench_times_packed_quantize_in_every_layout(tmp_path):
    """One q8ta_quantize / q8ta_dequantize row per layout x storage x dtype, named by those
    (not by the variant, printed beside it), so runs across variant changes compare."""
    result = _run([str(BENCHMARKS / "runtime_bench.py"), "--quick", "--skip-overhead", "--only", "^q8ta_"],
                  "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    cases = {f"{op} {layout} {storage} {dtype}"
             for op in ("q8ta_quantize", "q8ta_dequantize") for layout in ("4W4C", "4C", "4C1W")
             for storage in ("buffer", "texture3d") for dtype in ("float32", "float16")}
    rows = [line.split() for line in result.stdout.split("== Packed int8")[1].splitlines()
            if line.startswith("q8ta_")]
    assert {" ".join(row[:4]) for row in rows} == cases and len(rows) == len(cases)
    assert all(row[4].startswith(row[0] + "_") for row in rows), rows  # the variant that ran
    records = [json.loads(line) for line in (tmp_path / "runtime.jsonl").read_text().splitlines()]
    assert {r["case"] for r in records if r["kind"] == "kernel"} == cases


def test_runtime_bench_sweep_times_every_candidate(tmp_path):
    result = _run([str(BENCHMARKS / "runtime_bench.py"), "--quick", "--skip-overhead", "--sweep",
                   "--only", "quantize_per_token_(buffer_half_int8|texture3d_float_uint8)$|"
                   "choose_qparams_per_token_asymmetric_buffer_half$|"
                   "dynamic_quantize_per_token_texture3d_float$"], "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    sweep = result.stdout.split("== Units")[1].splitlines()
    for variant in ("quantize_per_token_buffer_half_int8", "quantize_per_token_texture3d_float_uint8"):
        rows = [line.split() for line in sweep if line.startswith(variant)]
        assert [row[1] for row in rows] == ["1", "2", "4", "8"]
        assert sum("choice)" in row for row in rows) == 1  # the op's own UNITS is marked
    assert sum(line.strip().startswith("best UNITS=") for line in sweep) == 2
    for variant, candidates in (("choose_qparams", CHOOSE_CANDIDATES),
                                ("dynamic_quantize", DYNAMIC_CANDIDATES)):
        rows = [line.split() for line in sweep if line.startswith(variant)]
        assert [tuple(map(int, row[1:4])) for row in rows] == list(candidates)
    assert sum(line.strip().startswith("best workgroup=") for line in sweep) == 2


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_conv2d_bench_runs_on_every_family(family, tmp_path):
    """The conv benchmark times the dispatcher's pick for the family next to every algorithm."""
    result = _run([str(BENCHMARKS / "conv2d_bench.py"), "--quick", "--batches", "1", "--only", "l4 3x3"],
                  family, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("resnet50 l4 3x3")]
    assert rows and sum("*" in row.split()[7] for row in rows if len(row.split()) > 7) == 1, result.stdout


def test_conv2d_bench_times_the_se_pairs(tmp_path):
    """The squeeze-and-excite rows: the pair and the two convs of each chosen gate shape, their
    ratio, and the total over the gates of those shapes."""
    result = _run([str(BENCHMARKS / "conv2d_bench.py"), "--quick", "--batches", "1", "--only",
                   "effnet se pair (32|144)-"], GPU_FAMILIES[0], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("effnet se pair")]
    assert [row[3] for row in rows] == ["32->8->32", "144->6->144"], result.stdout
    assert [int(row[4]) for row in rows] == [1, 2]
    for row in rows:
        assert float(row[7]) == pytest.approx(float(row[5]) / float(row[6]), abs=0.01)
        assert row[8].startswith("q8ta_conv2d_pw_pair_")
    assert any(line.startswith("all 3 gates") for line in result.stdout.splitlines()), result.stdout


def test_program_bench_runs(tmp_path):
    pytest.importorskip("torchao", reason="PT2E quantization needs torchao")
    import torch

    import runtime
    from runtime.tools.models import SmallCNN, quantize_pt2e

    torch.manual_seed(0)
    example = (torch.randn(1, 3, 16, 16),)
    runtime.lower(quantize_pt2e(SmallCNN().eval(), example, [example])).save(tmp_path / "small.etvk")
    result = _run([str(BENCHMARKS / "program_bench.py"), f"small_cnn:{tmp_path / 'small.etvk'}",
                   "--repeat", "2", "--warmup", "0", "--no-compile", "--one-word", "--slowest", "3"],
                  "llvmpipe", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "small_cnn" in result.stdout and "(not a torchvision architecture: no torch columns)" in result.stdout
    assert any(line.startswith("| small_cnn (one word) |") for line in result.stdout.splitlines())
    row = next(line for line in result.stdout.splitlines() if line.startswith("| small_cnn |"))
    on_device, nodes = row.split("|")[3].strip().split("/")
    assert on_device == nodes  # every node on the device
    assert "per op kind:" in result.stdout
    kinds = [line.split() for line in result.stdout.splitlines() if line.startswith("  q8ta_")]
    rates = {kind[0]: kind[-1] for kind in kinds}
    assert any(k.startswith("q8ta_conv2d") and rates[k] == "TOPS" for k in rates), kinds
    assert rates.get("q8ta_quantize") == "copy)", kinds  # GB/s against the copy bandwidth
    lines = result.stdout.splitlines()
    at = lines.index("small_cnn batch 1, the 3 slowest nodes:")
    slowest = [line.split() for line in lines[at + 1:at + 4]]
    times = [float(row[row.index("us") - 1]) for row in slowest]
    assert times == sorted(times, reverse=True) and all(t > 0 for t in times), slowest


def test_coop_gemm_bench_runs_to_the_end(tmp_path):
    """Tiny sizes; on a device without the coop variant its column says why."""
    from runtime.ops.library import catalog
    from runtime.vulkan.device import get_device

    result = _run([str(BENCHMARKS / "coop_gemm_bench.py"), "--quick", "--only", "l2 3x3|1024|GEMM"],
                  get_device().caps.family, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith(("resnet50", "int8 GEMM"))]
    assert len(rows) == 3 and all("q8ta_gemm_" in row for row in rows), result.stdout
    runnable = catalog().variant("q8ta_gemm_coop_k64_w4").runnable(get_device().caps)[0]
    assert ("coop: not run here" in result.stdout) != runnable


def test_linear_bench_times_the_streaming_floor(tmp_path):
    """Each one-token row has the streaming floor beside it: the read kernel of
    benchmarks/read_kernel/ is generated, loaded and timed over the same bytes."""
    from runtime.vulkan.device import get_device

    result = _run([str(BENCHMARKS / "linear_bench.py"), "--quick", "--tokens", "1", "--n", "256"],
                  get_device().caps.family, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines if line.split()[:2] == ["1", "256"]]
    ours = next(row for row in rows if row[2] == "ours")
    floor = next(row for row in rows if row[2:4] == ["streaming", "floor"])
    assert float(floor[-4]) > 0, result.stdout  # GPU microseconds
    assert floor[-3] == ours[-3]  # the same weight MB


def test_llm_bench_prints_decode_rows(tmp_path):
    """A tiny decoder through the whole LLM benchmark: one row per position, the prefill row, the
    KV cache's home, the time per op kind (the torch columns are n/a without CUDA), and
    cache_attention alone: a row per dtype and chunk length, a time per position, then a prefill
    row per dtype and token count within the cache (both kernels, the tiled one with the rule's,
    1, 4 and 8 lanes a row and with 16-key tiles, the split/tiled and 1-lane/tiled ratios, the
    rule's pick)."""
    result = _run([str(BENCHMARKS / "llm_bench.py"), "--preset", "tiny-llama", "--cache", "32",
                   "--positions", "3,20", "--prefill", "8", "--repeat", "2", "--warmup", "0.05", "--no-torch",
                   "--attention-prefills", "8,20,64"],
                  "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "KV cache in vulkan memory" in result.stdout and "peak host memory" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] in (["3"], ["20"])]
    # tokens/s print with a thousands separator (a tiny model on a GPU passes 1,000)
    assert [row[0] for row in rows] == ["3", "20"] and all(float(row[1].replace(",", "")) > 0 for row in rows)
    prefill = next(line for line in result.stdout.splitlines() if line.startswith("prefill of 8 tokens"))
    assert float(prefill.split("ours ")[1].split()[0]) > 0 and "int4 compile n/a" in prefill
    assert result.stdout.count("time per op kind at position") == 2
    assert "etvk.cache_attention.default" in result.stdout
    decode, prefill = result.stdout.split("cache_attention alone")[1].split("cache_attention prefill alone")
    attention = decode.splitlines()[2:]
    assert [row.split()[:2] for row in attention] == [[dtype, label] for dtype in ("float32", "float16")
                                                      for label in ("rule:", "grain", "grain", "one")]
    assert all(len(row.split(":")[1].split()) == 5 for row in attention)  # chunks x keys, 2 times
    prefill = [row.split() for row in prefill.splitlines()[2:]]  # 64 tokens: past the cache
    assert [row[:2] for row in prefill] == [[dtype, tokens] for dtype in ("float32", "float16")
                                           for tokens in ("8", "20")]
    assert all(all(float(time) > 0 for time in row[2:8]) and row[10] == "split" for row in prefill)


def test_q8ta_binary_bench_times_the_tables_beside_the_one_word_kernels(tmp_path):
    """The table ops' rows (DenseNet's channel_lut, EfficientNet's lut) in every layout, and with
    --one-word the one-word kernels' time and the quads / one-word ratio on every row."""
    result = _run([str(BENCHMARKS / "q8ta_binary_bench.py"), "--quick", "--one-word",
                   "--only", "(channel_lut .*|efficientnet lut .*|block concat 224\\+32 56) 2 "], "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("densenet", "efficientnet"))]
    names = {" ".join(row[:-9]) for row in rows}
    assert names == {"densenet block concat 224+32 56", "densenet channel_lut 256x56x56",
                     "densenet channel_lut 512x28x28", "densenet channel_lut 1024x14x14",
                     "efficientnet lut 32x112x112"}
    assert len(rows) == 3 * len(names) and all(row[-8] in ("4W4C", "4C", "4C1W") for row in rows)
    assert all(float(row[-1]) > 0 and float(row[-2]) > 0 for row in rows)  # quads / one word, its time
    records = [json.loads(line) for line in (tmp_path / "q8ta_binary.jsonl").read_text().splitlines()]
    assert sum(r.get("impl", "").endswith(" one word") for r in records) == len(rows)


def test_q8ta_binary_bench_times_the_fused_concat_beside_the_two_ops(tmp_path):
    """The fused concat + table rows, without and with the window sums, time q8ta_concat then
    q8ta_channel_lut in the same run and print that pair's time and the ratio fused / pair, in
    every layout."""
    result = _run([str(BENCHMARKS / "q8ta_binary_bench.py"), "--quick", "--only",
                   "concat_lut (64\\+32 56|128\\|32\\+32 28) 2 "], "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("densenet concat_lut")]
    assert [row[2] for row in rows] == ["64+32", "64+32", "64+32", "128|32+32", "128|32+32", "128|32+32"]
    assert [row[-8] for row in rows] == ["4W4C", "4C", "4C1W"] * 2
    for row in rows:
        fused, pair, ratio = float(row[-7]), float(row[-2]), float(row[-1])
        assert fused > 0 and pair > 0 and abs(ratio - fused / pair) <= 0.01 + 0.01 * ratio
    records = [json.loads(line) for line in (tmp_path / "q8ta_binary.jsonl").read_text().splitlines()]
    assert sum(r.get("impl", "").endswith("concat + channel_lut") for r in records) == 6


def test_q8ta_gather_pool_bench_times_each_op_beside_a_copy_of_its_bytes(tmp_path):
    """A shuffle, a ceil-mode max pool, an adaptive pool and window sums in every layout, each
    row's ratio its GB/s over the copy of the same bytes timed in the same run (the records')."""
    result = _run([str(BENCHMARKS / "q8ta_gather_pool_bench.py"), "--quick", "--only",
                   "(shuffle 116|max_pool 3x3 s2 ceil 480|adaptive|window_sum 2x2 128).* 2 "], "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [line.split() for line in result.stdout.splitlines()
            if line.startswith(("shufflenet", "googlenet", "vgg", "densenet"))]
    cases = {f"{' '.join(row[:-6])} b{row[-6]}" for row in rows}
    assert cases == {"shufflenet shuffle 116x28x28 b2", "googlenet max_pool 3x3 s2 ceil 480x28x28 b2",
                     "vgg adaptive_avg_pool 512x14x14 to 7x7 b2", "densenet window_sum 2x2 128x56x56 b2"}
    assert [row[-5] for row in rows] == ["4W4C", "4C", "4C1W"] * 4
    records = [json.loads(line) for line in (tmp_path / "q8ta_gather_pool.jsonl").read_text().splitlines()]
    copies = {r["case"]: r["bytes"] / r["seconds"] for r in records if r.get("impl") == "copy"}
    assert set(copies) == cases
    timed = [r for r in records if r.get("impl", "").startswith("etvk ")]
    assert len(timed) == len(rows)
    for row, r in zip(rows, timed, strict=True):
        assert r["case"] == f"{' '.join(row[:-6])} b{row[-6]}" and r["impl"] == f"etvk {row[-5]}"
        ratio = r["bytes"] / r["seconds"] / copies[r["case"]]
        assert float(row[-4]) > 0 and abs(float(row[-1]) - ratio) <= 0.006 + 0.001 * ratio


def test_q8ta_binary_bench_times_affine_tables_beside_random_ones(tmp_path):
    """--affine: the per-channel table rows also time tables the shaders compute as affine maps,
    with the time ratio to the random tables' and their GB/s over torch's (n/a without CUDA)."""
    result = _run([str(BENCHMARKS / "q8ta_binary_bench.py"), "--quick", "--affine", "--only",
                   "(channel_lut 256x56x56|concat_lut 64\\+32 56) 2 4C$"], "nvidia", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.split("\nshape", 1)[1].splitlines()[0].split()[-3:] == ["a/rand", "a", "ratio"]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("densenet")]
    assert [row[1] for row in rows] == ["channel_lut", "concat_lut"]
    records = [json.loads(line) for line in (tmp_path / "q8ta_binary.jsonl").read_text().splitlines()]
    for row in rows:
        case = [r for r in records if r.get("case", "").startswith(f"densenet {row[1]}")]
        ours = next(r["seconds"] for r in case if r["impl"] == "etvk 4C")
        affine = next(r["seconds"] for r in case if r["impl"] == "etvk 4C affine tables")
        assert abs(float(row[-3]) - affine * 1e6) <= 0.06 and abs(float(row[-2]) - affine / ours) <= 0.006
        assert (row[-1] == "n/a") == (not torch.cuda.is_available())
