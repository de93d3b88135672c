"""A loaded decoder whose cache_attention splits its keys into chunks (the split's grain made
small, so that the 16-position cache takes 4 chunks of 4 keys): the split is recorded once at
load, its scratch comes from the program's memory plan, and token after token the positions
move through the chunks as the replays go on. Every step's logits match the same program run
with the reference kernels and PyTorch's, as tests/runtime/programs/test_decoders.py asks of
the unsplit attention."""

from __future__ import annotations

import json

import torch
from program_cases import sqnr_db

import runtime
from runtime.families import attention as split_rule
from runtime.tools import llm_models

CACHE = 16
CONFIG = dict(model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)


def test_a_decoder_with_split_attention_matches_its_references(tmp_path, monkeypatch):
    llm_models.import_transformers()
    (tmp_path / "llama.json").write_text(json.dumps(CONFIG))
    exported = llm_models.export_decoder(
        llm_models.quantize_8da4w(llm_models.decoder(tmp_path / "llama.json")), CACHE)
    program = runtime.lower(exported)
    program.save(tmp_path / "llama.etvk")
    monkeypatch.setattr(split_rule, "CHUNK_GRAIN", 4)
    assert split_rule.attention_split(CONFIG["num_key_value_heads"], CACHE).chunks == 4
    loaded, module, state = runtime.load(tmp_path / "llama.etvk"), exported.module(), program.initial_state()
    assert "cache_attention_float+cache_attention_combine_float" in {r["variant"] for r in loaded.placement()}
    gen = torch.Generator().manual_seed(3)
    for position, token in enumerate(torch.randint(0, CONFIG["vocab_size"], (CACHE,), generator=gen)):
        inputs = dict(input_ids=token.reshape(1, 1), cache_position=torch.tensor([position]))
        got, want = loaded(**inputs), module(**inputs)
        assert sqnr_db(got, program.run_reference(*inputs.values(), state=state)) >= 80, position
        assert sqnr_db(got, want) >= 30, position
