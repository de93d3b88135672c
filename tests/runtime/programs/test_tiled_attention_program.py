"""A loaded decoder whose prefill runs cache_attention's tiled kernel (the rule's threshold made
small, so that a call of 4 tokens takes it): the kernel is recorded once at load, and prompt
after prompt (positions from 0 and further on, a cache holding the earlier prompts) the logits
match the same program run with the reference kernels and PyTorch's, as
tests/runtime/programs/test_decoders.py asks of the split kernel."""

from __future__ import annotations

import json

import torch
from program_cases import sqnr_db

import runtime
from runtime.families import attention as split_rule
from runtime.tools import llm_models

CACHE = 16
TOKENS = 4
CONFIG = dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)


def test_a_decoder_with_tiled_prefill_attention_matches_its_references(tmp_path, monkeypatch):
    llm_models.import_transformers()
    (tmp_path / "llama.json").write_text(json.dumps(CONFIG))
    exported = llm_models.export_decoder(
        llm_models.quantize_8da4w(llm_models.decoder(tmp_path / "llama.json")), CACHE, tokens=TOKENS)
    program = runtime.lower(exported)
    program.save(tmp_path / "llama.etvk")
    monkeypatch.setattr(split_rule, "TILED_MIN_TOKENS", TOKENS)
    loaded, module, state = runtime.load(tmp_path / "llama.etvk"), exported.module(), program.initial_state()
    variants = {r["variant"] for r in loaded.placement() if r["target"] == "etvk.cache_attention.default"}
    assert variants == {"cache_attention_tiled_float"}, variants
    gen = torch.Generator().manual_seed(5)
    for start in range(0, CACHE, TOKENS):
        inputs = dict(input_ids=torch.randint(0, CONFIG["vocab_size"], (1, TOKENS), generator=gen),
                      cache_position=torch.arange(start, start + TOKENS))
        got, want = loaded(**inputs), module(**inputs)
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 80, start
        assert sqnr_db(got, want) >= 30, start
