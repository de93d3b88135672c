"""Decoder LLMs from ``transformers`` (random weights from small configs), quantized 8da4w and
exported the way the ecosystem exports them (``TorchExportableModuleForDecoderOnlyLM``, a static
KV cache updated in place): lowered, saved, loaded, and run token by token.

Families chosen for their variations: Llama (the base), Qwen2 (biases on q, k and v), Mistral
(a sliding window in the mask, wider than the cache, and one of 8 keys: sliding-window
attention), Gemma 3 (a sliding layer and a global one, q/k RMSNorms after the heads-first
transpose), Qwen3 (q/k RMSNorm), Gemma (``(1 + w)``
RMSNorm, embedding scaling, GELU-tanh MLP, tied embeddings), Phi-3 (fused qkv and gate/up
projections, read through slices; its rotary embedding in the partial form, here rotating all
of each head), Phi-3 with ``partial_rotary_factor`` 0.5 (half of each head rotated, the rest
passed through), Granite (scalar multipliers on embeddings, residuals, attention and logits),
all with grouped-query attention; and two LayerNorm families, OLMo (no weight nor bias) and
StableLM (weight and bias, a quarter of each head rotated). The lowering puts every node on the device (the embedding,
RMSNorms, the linears, one per slice of a fused projection, rotary embeddings, cache writes,
attention, activation x up, residual adds and scalar multipliers; reshapes are views), and the
KV cache stays there. Teacher forcing against PyTorch's own run of the exported module (logits SQNR >= 30
dB at every step) and against the program's reference run (SQNR >= 80 dB: RMSNorm, activations
and attention are within their ops' stated tolerances, not bit-exact; docs/llm_ops.md,
docs/attention_ops.md), greedy `runtime.generate` against PyTorch's greedy tokens, the CLI from
a ``save_pretrained`` folder. The linears' per-token activation quantization runs on the device,
once per quantized tensor (q, k and v share one), fused with the RMSNorm or activation x up
before it, the residual adds with the RMSNorm after them, and each layer's rotary embeddings
and cache writes into one rope_cache_update (lower_fusion.py): fewer dispatches, the same bits.

The same families in half precision (``model.half()``, 8da4w with fp16 precision and scales):
every node on the device too, the KV cache an fp16 tensor in device memory, fp16 logits; teacher
forcing against PyTorch's own fp16 run of the export on the CPU (SQNR >= 30 dB: the fused linears
skip the fp16 rounding of each dequantized operand that PyTorch's carry, docs/llm_ops.md) and
against the program's reference run (SQNR >= 60 dB, see `test_half_teacher_forcing`).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from program_cases import sqnr_db

import runtime
from runtime.programs import lower_fusion
from runtime.programs.generate import GenerationError
from runtime.programs.input_checks import InputValueError
from runtime.tools import llm_models

CACHE = 16
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
FAMILIES = {
    "llama": dict(model_type="llama"),
    "qwen2": dict(model_type="qwen2"),
    "mistral": dict(model_type="mistral", sliding_window=64),
    "mistral_sliding": dict(model_type="mistral", sliding_window=8),
    "gemma3": dict(model_type="gemma3_text", head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                   layer_types=["sliding_attention", "full_attention"]),
    "qwen3": dict(model_type="qwen3", head_dim=16),
    "gemma": dict(model_type="gemma", head_dim=16),
    "phi3": dict(model_type="phi3"),
    "phi3_partial_rotary": dict(model_type="phi3", partial_rotary_factor=0.5),
    "granite": dict(model_type="granite", embedding_multiplier=2.0, residual_multiplier=0.5,
                    attention_multiplier=0.2, logits_scaling=4.0),
}


# Families normalized by LayerNorm (the mean taken off, a bias): OLMo (no weight nor bias) and
# StableLM (weight and bias; a quarter of each head rotated).
LAYER_NORM_FAMILIES = {
    "olmo": dict(model_type="olmo"),
    "stablelm": dict(model_type="stablelm", partial_rotary_factor=0.25),
}


def config_file(folder, family: str):
    path = folder / f"{family}.json"
    path.write_text(json.dumps({**COMMON, **{**FAMILIES, **LAYER_NORM_FAMILIES}[family]}))
    return path


def lowered_decoder(family: str, folder, half: bool = False):
    """(family, exported program, lowered program, file) of `family`'s model (fp16 with `half`),
    quantized 8da4w, exported with a CACHE-position static cache, lowered and saved in `folder`."""
    llm_models.import_transformers()
    model = llm_models.decoder(config_file(folder, family))
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(model.half() if half else model), CACHE)
    program = runtime.lower(exported)
    program.save(folder / f"{family}.etvk")
    return family, exported, program, folder / f"{family}.etvk"


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def decoder(request, tmp_path_factory):
    """(family, exported program, lowered program, file)."""
    return lowered_decoder(request.param, tmp_path_factory.mktemp("decoders"))


@pytest.fixture(scope="module", params=sorted(LAYER_NORM_FAMILIES))
def layer_norm_decoder(request, tmp_path_factory):
    """(family, exported program, lowered program, file) of a LayerNorm family."""
    return lowered_decoder(request.param, tmp_path_factory.mktemp("layer_norm_decoders"))


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def half_decoder(request, tmp_path_factory):
    """(family, exported program, lowered program, file) of the family's fp16 model."""
    return lowered_decoder(request.param, tmp_path_factory.mktemp("half_decoders"), half=True)


def greedy_reference(module, prompt: list[int], count: int) -> list[int]:
    """PyTorch's greedy tokens: the exported module called one token at a time."""
    tokens = []
    for position, token in enumerate(prompt + tokens):
        logits = module(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([position]))
    while len(tokens) < count:
        tokens.append(int(torch.argmax(logits[0, -1])))
        logits = module(input_ids=torch.tensor([[tokens[-1]]]),
                        cache_position=torch.tensor([len(prompt) + len(tokens) - 1]))
    return tokens


def test_the_cache_is_state_and_inputs_are_checked(decoder):
    _, exported, program, _ = decoder
    assert len(program.state) == 2 * COMMON["num_hidden_layers"]  # keys and values per layer
    assert all(start is None for start in program.state.values())  # zeros: no bytes in the file
    assert {(c.input, c.kind, c.bound) for c in program.input_checks} == \
        {("input_ids", "index", COMMON["vocab_size"]), ("cache_position", "position", CACHE),
         ("cache_position", "consecutive", 1)}
    linears = [n for n in program.nodes if n.target == "etvk.linear_qta8a_qga4w.default"]
    assert linears and not [n for n in program.nodes if n.target == "aten.linear.default"]


# etvk ops every family's lowered program must hold at least (beside the linears); its RMSNorms
# and activation x up run fused with the quantization of the linears' inputs, the residual
# adds with the RMSNorm after them, and each layer's rotary embeddings of q and k with its
# cache writes (UNFUSED: none of those ops is left alone)
DECODER_OPS = {"etvk.embedding.default", "etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default",
               "etvk.act_mul_quantize.default"}
ATTENTION_OPS = {"etvk.rope_cache_update.default", "etvk.cache_attention.default"}
UNFUSED = {"etvk.rope.default", "etvk.cache_update.default"}


def test_the_decoder_runs_on_the_device_with_its_cache(decoder):
    _, _, program, path = decoder
    targets = {n.target for n in program.nodes}
    assert DECODER_OPS <= targets
    loaded = runtime.load(path)
    assert ATTENTION_OPS <= targets and not UNFUSED & targets
    assert set(loaded.state_placement().values()) == {"vulkan"}
    # positions, rotary tables, the scaling of logits: every node on the device
    assert [(r["node"], r["target"]) for r in loaded.placement() if r["runs_on"] != "vulkan"] == []


def test_a_prompt_in_one_call_and_positions_that_must_be_consecutive(tmp_path):
    """An export for 4 tokens a call prefills 4 at once; it read the positions as the first plus
    0, 1, 2, 3, so other positions are refused."""
    llm_models.import_transformers()
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(
        llm_models.decoder(config_file(tmp_path, "llama"))), CACHE, tokens=4)
    program = runtime.lower(exported)
    assert ("cache_position", "consecutive", 4) in {(c.input, c.kind, c.bound) for c in program.input_checks}
    program.save(tmp_path / "prefill.etvk")
    loaded, module = runtime.load(tmp_path / "prefill.etvk"), exported.module()
    for start in (0, 4, 8):
        inputs = dict(input_ids=torch.tensor([[start + 1, 7, 3, 9]]), cache_position=torch.arange(start, start + 4))
        assert sqnr_db(loaded(**inputs), module(**inputs)) >= 30, start
    loaded.reset()
    with pytest.raises(InputValueError, match=r"input 'cache_position' must hold consecutive positions"):
        loaded(input_ids=torch.tensor([[1, 2, 3, 4]]), cache_position=torch.tensor([0, 1, 3, 4]))


QUANTIZE = "etvk.quantize_affine_per_token_dynamic.default"
# what quantizes a linear's input: torchao's choose_qparams_affine + quantize_affine, alone or
# fused with the RMSNorm (and the residual add before it) or activation x up before it
# (runtime/programs/lower_fusion.py)
QUANTIZING = {QUANTIZE, "etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default",
              "etvk.act_mul_quantize.default"}
VIEWS = {"aten.alias.default", "aten.view.default", "aten.reshape.default"}


def test_dynamic_activation_quantization_runs_on_the_device(decoder):
    """Each 8da4w linear reads a per-token quantization (quantize_affine_per_token_dynamic, or
    it fused with the norm or activation x up before it), one per quantized tensor, and the
    zero points' int32 cast is gone."""
    _, _, program, path = decoder
    found = [n.target for n in program.nodes]
    assert not [t for t in found if t.startswith("torchao.")], found
    producers = program.producers()
    feeding = [producers[n.args[0].name] for n in program.nodes if n.target == "etvk.linear_qta8a_qga4w.default"]
    assert {n.target for n in feeding} == QUANTIZING
    assert len({n.name for n in feeding}) == sum(found.count(t) for t in QUANTIZING)
    assert "aten._to_copy.default" not in found, found
    placed = [r["runs_on"] for r in runtime.load(path).placement() if r["target"] in QUANTIZING]
    assert placed and set(placed) == {"vulkan"}, placed


def test_no_quantize_reads_a_norm_or_activation(decoder):
    """No quantize_affine_per_token_dynamic is left reading an rms_norm or act_mul (directly or
    through views), nor an rms_norm_quantize reading a binary add (Gemma's first norm reads
    the scaled embedding, a binary mul): each is one fused node.
    Llama: every norm (two a layer and the final one), every residual add (two a layer: every
    norm but the first reads one) and every activation x up is fused, and only the output
    projections' inputs (the attention's output) are quantized alone."""
    family, _, program, _ = decoder
    producers = program.producers()
    for node in (n for n in program.nodes if n.target == QUANTIZE):
        source = producers.get(node.args[0].name)
        while source is not None and source.target in VIEWS:
            source = producers.get(source.args[0].name)
        assert source is None or source.target not in ("etvk.rms_norm.default", "etvk.act_mul.default"), node
    for node in (n for n in program.nodes if n.target == "etvk.rms_norm_quantize.default"):
        source = producers.get(node.args[0].name)
        assert source is None or source.target != "etvk.binary.default" or source.args[2] != "add", node
    if family == "llama":
        targets = [n.target for n in program.nodes]
        layers = COMMON["num_hidden_layers"]
        counted = (QUANTIZE, "etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default",
                   "etvk.act_mul_quantize.default", "etvk.rms_norm.default", "etvk.act_mul.default",
                   "etvk.binary.default")
        assert [targets.count(t) for t in counted] == [layers, 1, 2 * layers, layers, 0, 0, 0]


def device_dispatches(loaded) -> int:
    """Dispatches a call of `loaded` records (placement's variants, one per dispatch)."""
    return sum(len(r["variant"].split("+")) for r in loaded.placement() if r["variant"])


def test_fusion_saves_dispatches_and_changes_no_bit(tmp_path, monkeypatch):
    """Llama lowered with and without lower_fusion.py: a call of the fused program makes 8
    dispatches fewer a layer (two norms, two residual adds, the activation's quantize, and
    rope_cache_update's 1 for two ropes and two cache writes) and one fewer for the final
    norm, and its logits are the unfused program's bit for bit at every decode step (the fused
    ops are bit-exact against the ops they replace on the device; docs/llm_ops.md)."""
    llm_models.import_transformers()
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(
        llm_models.decoder(config_file(tmp_path, "llama"))), CACHE)
    runtime.lower(exported).save(tmp_path / "fused.etvk")
    with monkeypatch.context() as patch:
        patch.setattr(lower_fusion, "fuse_decoder_ops", lambda rewriter: None)
        runtime.lower(exported).save(tmp_path / "unfused.etvk")
    fused, unfused = runtime.load(tmp_path / "fused.etvk"), runtime.load(tmp_path / "unfused.etvk")
    layers = COMMON["num_hidden_layers"]
    assert device_dispatches(unfused) - device_dispatches(fused) == 8 * layers + 1
    assert len(unfused.program.nodes) - len(fused.program.nodes) == 8 * layers + 1 + 1  # and the final norm's alias
    for position, token in enumerate([5, 17, 3, 60, 11, 2]):
        inputs = dict(input_ids=torch.tensor([[token]]), cache_position=torch.tensor([position]))
        got, want = fused(**inputs), unfused(**inputs)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), position


def test_teacher_forcing_against_pytorch(decoder):
    family, exported, program, path = decoder
    loaded, module, state = runtime.load(path), exported.module(), program.initial_state()
    gen = torch.Generator().manual_seed(1)
    for position, token in enumerate(torch.randint(0, COMMON["vocab_size"], (CACHE,), generator=gen)):
        inputs = dict(input_ids=token.reshape(1, 1), cache_position=torch.tensor([position]))
        got, want = loaded(**inputs), module(**inputs)
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 80, (family, position)
        assert sqnr_db(got, want) >= 30, (family, position)


def test_layer_norm_decoders_run_on_the_device_and_follow_pytorch(layer_norm_decoder):
    """Every node of a LayerNorm family on the device (its norms etvk.layer_norm), its cache
    there; teacher forcing as the RMSNorm families' (>= 80 dB against the program's reference
    run, >= 30 dB against PyTorch's) and PyTorch's greedy tokens."""
    family, exported, program, path = layer_norm_decoder
    targets = {n.target for n in program.nodes}
    assert "etvk.layer_norm.default" in targets and "aten.layer_norm.default" not in targets
    assert ATTENTION_OPS <= targets and not UNFUSED & targets
    loaded = runtime.load(path)
    assert set(loaded.state_placement().values()) == {"vulkan"}
    assert [(r["node"], r["target"]) for r in loaded.placement() if r["runs_on"] != "vulkan"] == []
    module, state = exported.module(), program.initial_state()
    gen = torch.Generator().manual_seed(1)
    for position, token in enumerate(torch.randint(0, COMMON["vocab_size"], (CACHE,), generator=gen)):
        inputs = dict(input_ids=token.reshape(1, 1), cache_position=torch.tensor([position]))
        got, want = loaded(**inputs), module(**inputs)
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 80, (family, position)
        assert sqnr_db(got, want) >= 30, (family, position)
    loaded.reset()
    assert runtime.generate(loaded, [5, 17, 3], 8) == greedy_reference(module, [5, 17, 3], 8)


def test_generate_gives_pytorchs_greedy_tokens(decoder):
    _, exported, _, path = decoder
    loaded = runtime.load(path)
    prompt = [5, 17, 3]
    want = greedy_reference(exported.module(), prompt, 8)
    assert runtime.generate(loaded, prompt, 8) == want
    stop = want[2]  # generation ends at its first occurrence, which it returns
    assert runtime.generate(loaded, torch.tensor(prompt), 8, eos_token_id=stop) == want[:want.index(stop) + 1]


def test_bad_requests_are_clear_errors(decoder):
    loaded = runtime.load(decoder[3])
    with pytest.raises(GenerationError, match=r"prompt_ids \(15 tokens\) and max_new_tokens \(4\) need "
                                              r"18 cache positions; the cache holds 16"):
        runtime.generate(loaded, list(range(15)), 4)
    with pytest.raises(InputValueError, match=r"input 'input_ids' holds the token id 96, outside \[0, 96\)"):
        runtime.generate(loaded, [1, COMMON["vocab_size"]], 2)
    with pytest.raises(GenerationError, match="prompt_ids is empty"):
        runtime.generate(loaded, [], 2)


def test_export_llm_and_generate_from_a_saved_folder(tmp_path):
    """The real loading path: config.json and safetensors weights written by save_pretrained."""
    llm_models.import_transformers()
    model = llm_models.decoder(config_file(tmp_path, "llama"), seed=3)
    model.save_pretrained(tmp_path / "model")
    out = tmp_path / "llama.etvk"
    cli = [sys.executable, "-m", "runtime"]
    done = subprocess.run([*cli, "export-llm", str(tmp_path / "model"), "--out", str(out),
                           "--max-cache-len", str(CACHE)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "quantizing 8da4w" in done.stderr and out.exists()
    done = subprocess.run([*cli, "generate", str(out), "--prompt", "4,8,15", "--max-new-tokens", "5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    tokens = [int(t) for t in done.stdout.splitlines()[0].split(",")]
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(
        llm_models.decoder(tmp_path / "model")), CACHE)
    assert tokens == greedy_reference(exported.module(), [4, 8, 15], 5)
    assert "time to first token" in done.stdout and "decode" in done.stdout
    # `run`: in-range token ids and positions, each call from a fresh cache
    done = subprocess.run([*cli, "run", str(out), "--repeat", "2"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "against PyTorch on the CPU" in done.stdout
    done = subprocess.run([*cli, "inspect", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "state: 4 tensors of 8 KiB (4 on vulkan)" in done.stdout, done.stdout
    done = subprocess.run([*cli, "generate", str(out), "--prompt", "4,8,15", "--max-new-tokens", "20"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("prompt_ids (3 tokens) and max_new_tokens (20) need "
                                                    "22 cache positions; the cache holds 16")


# ---------------------------------------------------------------- half precision


# etvk ops every family's fp16 program must hold at least (the fused norm / activation x up +
# quantize ops take fp32 only, so these run unfused)
HALF_OPS = {"etvk.embedding.default", "etvk.rms_norm.default", "etvk.act_mul.default", "etvk.binary.default",
            "etvk.cast.default"}


def test_half_decoder_runs_on_the_device_with_an_fp16_cache(half_decoder):
    """The fp16 graph's casts (RMSNorm's fp32 computation, each quantized linear's fp32 result
    narrowed to fp16) and torchao's fp16 per-token quantization all lower: nothing on the CPU."""
    family, _, program, path = half_decoder
    targets = [n.target for n in program.nodes]
    assert HALF_OPS | ATTENTION_OPS <= set(targets) and not UNFUSED & set(targets), family
    assert not [t for t in targets if t.startswith(("torchao.", "aten.linear", "aten._to_copy", "aten.to."))]
    assert {program.values[name].dtype for name in program.state} == {torch.float16}
    quantized = [n.args[0] for n in program.nodes if n.target == "etvk.quantize_affine_per_token_dynamic.default"]
    assert quantized and {program.values[x.name].dtype for x in quantized} == {torch.float16}
    # every cast's value has the cast's dtype (also those the lowering made anew: Gemma 3's moved norms)
    casts = [n for n in program.nodes if n.target == "etvk.cast.default"]
    assert [program.values[n.outputs[0]].dtype for n in casts] == [n.args[1] for n in casts], family
    loaded = runtime.load(path)
    assert set(loaded.state_placement().values()) == {"vulkan"}
    assert [(r["node"], r["target"]) for r in loaded.placement() if r["runs_on"] != "vulkan"] == []


def test_half_teacher_forcing(half_decoder):
    """Logits are fp16. Against PyTorch's fp16 run >= 30 dB. Against the program's reference run
    >= 60 dB: the ops with a tolerance (rms_norm, act_mul, attention) may flip the rounding of an
    fp16 value by one step (2**-11 relative) where the reference does not, which later layers
    carry; 60 dB is an error of 0.1 % of the logits' magnitude, about two fp16 steps."""
    family, exported, program, path = half_decoder
    loaded, module, state = runtime.load(path), exported.module(), program.initial_state()
    gen = torch.Generator().manual_seed(1)
    for position, token in enumerate(torch.randint(0, COMMON["vocab_size"], (CACHE,), generator=gen)):
        inputs = dict(input_ids=token.reshape(1, 1), cache_position=torch.tensor([position]))
        got, want = loaded(**inputs), module(**inputs)
        assert got.dtype == want.dtype == torch.float16
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 60, (family, position)
        assert sqnr_db(got, want) >= 30, (family, position)

