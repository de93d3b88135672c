"""Loaded decoders whose cache_attention runs its other kernels, each recorded once at load and
matching, call after call, the same program run with the reference kernels and PyTorch's, as
tests/runtime/programs/test_decoders.py asks of the plain attention:

- the split kernel (the split's grain made small, so that the 16-position cache takes 4 chunks
  of 4 keys): its scratch comes from the program's memory plan, and token after token the
  positions move through the chunks as the replays go on;
- the tiled kernel (the rule's threshold made small, so that a call of 4 tokens takes it), its
  rows in the rule's lanes (4 of a head dim of 16 where the device has subgroup shuffles):
  prompt after prompt, positions from 0 and further on, the cache holding the earlier prompts.
"""

from __future__ import annotations

import json

import torch
from program_cases import sqnr_db

import runtime
from runtime.families import attention as split_rule
from runtime.ops import stub_support
from runtime.tools import llm_models

CACHE = 16
TOKENS = 4  # a call of the tiled test
CONFIG = dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)


def _saved_llama(folder, tokens: int = 1):
    """(exported program, lowered program, saved file) of the 8da4w Llama of CONFIG, `tokens`
    tokens a call."""
    llm_models.import_transformers()
    (folder / "llama.json").write_text(json.dumps(CONFIG))
    exported = llm_models.export_decoder(
        llm_models.quantize_8da4w(llm_models.decoder(folder / "llama.json")), CACHE, tokens=tokens)
    program = runtime.lower(exported)
    program.save(folder / "llama.etvk")
    return exported, program, folder / "llama.etvk"


def _matches_its_references(loaded, exported, program, calls):
    """Each call of `calls` ((input_ids, cache_position) pairs) on the loaded program agrees
    with the reference run of the program and with PyTorch's run of the export."""
    module, state = exported.module(), program.initial_state()
    for input_ids, cache_position in calls:
        inputs = dict(input_ids=input_ids, cache_position=cache_position)
        got, want = loaded(**inputs), module(**inputs)
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 80, cache_position
        assert sqnr_db(got, want) >= 30, cache_position


def test_a_decoder_with_split_attention_matches_its_references(tmp_path, monkeypatch):
    exported, program, path = _saved_llama(tmp_path)
    monkeypatch.setattr(split_rule, "CHUNK_GRAIN", 4)
    assert split_rule.attention_split(CONFIG["num_key_value_heads"], CACHE).chunks == 4
    loaded = runtime.load(path)
    assert "cache_attention_float+cache_attention_combine_float" in {r["variant"] for r in loaded.placement()}
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, CONFIG["vocab_size"], (CACHE,), generator=gen)
    _matches_its_references(loaded, exported, program,
                            [(token.reshape(1, 1), torch.tensor([position])) for position, token in enumerate(tokens)])


def test_a_decoder_with_tiled_prefill_attention_matches_its_references(tmp_path, monkeypatch):
    exported, program, path = _saved_llama(tmp_path, TOKENS)
    monkeypatch.setattr(split_rule, "TILED_MIN_TOKENS", TOKENS)
    loaded = runtime.load(path)
    variants = {r["variant"] for r in loaded.placement() if r["target"] == "etvk.cache_attention.default"}
    lanes = stub_support.attention_lanes(CONFIG["hidden_size"] // CONFIG["num_attention_heads"])
    assert variants == {f"cache_attention_tiled_float_{'shuffle' if lanes > 1 else 'none'}"}, variants
    gen = torch.Generator().manual_seed(5)
    _matches_its_references(loaded, exported, program,
                            [(torch.randint(0, CONFIG["vocab_size"], (1, TOKENS), generator=gen),
                              torch.arange(start, start + TOKENS)) for start in range(0, CACHE, TOKENS)])
