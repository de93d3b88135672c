"""A decoder exported with a dynamic token count (``dynamic_shapes`` on ``input_ids`` and
``cache_position``): one file whose graphs take 1, 2, 4, ... tokens a call. A prompt of any length
goes in one call (in chunks of those counts, largest first) and decoding goes one token a call,
both against PyTorch's own run of the dynamic export (also of an fp16 model); one token at a time
gives the same logits;
bad inputs are refused before anything runs; programs that are not such decoders are refused when
lowered.
"""

from __future__ import annotations

import pytest
import torch
from program_cases import sqnr_db
from test_decoders import CACHE, COMMON, config_file, greedy_reference

import runtime
from runtime.programs.chunking import chunks
from runtime.programs.cpu import ProgramInputError
from runtime.programs.from_export import LoweringError
from runtime.programs.input_checks import InputValueError
from runtime.programs.last_token import last_token_program
from runtime.programs.nodes import ValueSpec
from runtime.tools import llm_models
from runtime.vulkan.memory import DIRECT_READ_LIMIT

VOCAB = COMMON["vocab_size"]


@pytest.fixture(scope="module", params=["llama", "gemma", "phi3_partial_rotary", "llama half"])
def dynamic(request, tmp_path_factory):
    """(family, exported program, lowered program, file) of a dynamic token count ("half": the
    fp16 model)."""
    llm_models.import_transformers()
    folder = tmp_path_factory.mktemp("dynamic")
    family, _, half = request.param.partition(" ")
    model = llm_models.decoder(config_file(folder, family))
    model = llm_models.quantize_8da4w(model.half() if half else model)
    exported = llm_models.export_decoder(model, CACHE, dynamic=True)
    program = runtime.lower(exported)
    program.save(folder / "dynamic.etvk")
    return request.param, exported, program, folder / "dynamic.etvk"


def test_one_file_holds_a_graph_per_token_count(dynamic):
    _, _, program, path = dynamic
    assert program.tokens == 1 and sorted(program.specializations) == [2, 4, 8, 16]
    assert program.token_inputs == {"input_ids": 1, "cache_position": 0} and program.token_outputs == [1]
    for size, graph in program.specializations.items():
        assert graph.values["input_ids"].shape == (1, size) and graph.constants is program.constants
        assert ("cache_position", "consecutive", size) in {(c.input, c.kind, c.bound) for c in graph.input_checks}
    loaded = runtime.Program.load(path)
    assert sorted(loaded.specializations) == [2, 4, 8, 16]
    assert all(g.constants is loaded.constants and g.state is loaded.state
               for g in loaded.specializations.values())
    assert [n.target for n in loaded.specializations[8].nodes] == \
        [n.target for n in program.specializations[8].nodes]


def test_every_graph_runs_on_the_device_with_one_cache(dynamic):
    """Every graph fuses each layer's rotary embeddings and cache writes into one
    rope_cache_update and runs wholly on the device, over one cache."""
    _, _, program, path = dynamic
    for graph in (program, *program.specializations.values()):
        targets = [n.target for n in graph.nodes]
        assert targets.count("etvk.rope_cache_update.default") == COMMON["num_hidden_layers"]
        assert not {"etvk.rope.default", "etvk.cache_update.default"} & set(targets)
    loaded = runtime.load(path)
    assert loaded.token_counts == [1, 2, 4, 8, 16]
    assert set(loaded.state_placement().values()) == {"vulkan"}
    for size in loaded.token_counts:
        assert [r["node"] for r in loaded.placement(size) if r["runs_on"] != "vulkan"] == [], size
    assert loaded.memory_plan(16)["planned_bytes"] > loaded.memory_plan()["planned_bytes"]
    with pytest.raises(ValueError, match=r"no graph for 3 tokens a call; it has 1, 2, 4, 8, 16"):
        loaded.placement(3)


def test_a_prompt_in_one_call_then_decode_against_pytorch(dynamic):
    """11 tokens run as 8 + 2 + 1; PyTorch runs the dynamic export with all 11 at once."""
    family, exported, program, path = dynamic
    loaded, module = runtime.load(path), exported.module()
    prompt = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(2))
    got = loaded(input_ids=prompt, cache_position=torch.arange(11))
    want = module(input_ids=prompt, cache_position=torch.arange(11))
    assert got.shape == (1, 11, VOCAB) and sqnr_db(got, want) >= 30, family
    # the reference run takes the same chunks (within the float ops' tolerances: docs/llm_ops.md)
    assert sqnr_db(got, program.run_reference(prompt, torch.arange(11))) >= 60, family
    for position in range(11, 14):  # decode after the prompt reads the cache the chunks wrote
        token = torch.tensor([[position % VOCAB]])
        inputs = dict(input_ids=token, cache_position=torch.tensor([position]))
        assert sqnr_db(loaded(**inputs), module(**inputs)) >= 30, (family, position)
    # the same tokens one at a time: the same logits as the chunks
    loaded.reset()
    single = torch.cat([loaded(input_ids=prompt[:, i:i + 1], cache_position=torch.tensor([i]))
                        for i in range(11)], dim=1)
    assert sqnr_db(single, got) >= 80, family


def test_generate_prefills_in_one_call(dynamic):
    _, exported, _, path = dynamic
    loaded = runtime.load(path)
    prompt = [5, 17, 3, 40, 41]
    assert runtime.generate(loaded, prompt, 6) == greedy_reference(exported.module(), prompt, 6)
    runtime.generate(loaded, prompt, 1)  # the prompt's call alone: chunks of 4 and 1 tokens
    assert [graph.program.tokens for graph, _ in loaded._last_call] == [4, 1]


def test_bad_calls_are_refused_before_anything_runs(dynamic):
    _, _, _, path = dynamic
    loaded = runtime.load(path)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    first = loaded(input_ids=ids, cache_position=torch.arange(5))
    loaded.reset()
    with pytest.raises(InputValueError, match=r"input 'cache_position' holds the position 16, outside \[0, 16\)"):
        loaded(input_ids=torch.ones((1, 17), dtype=torch.long), cache_position=torch.arange(17))
    with pytest.raises(InputValueError, match=r"input 'input_ids' holds the token id 96, outside \[0, 96\)"):
        loaded(input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 96]]), cache_position=torch.arange(9))
    with pytest.raises(InputValueError, match="must hold consecutive positions"):
        loaded(input_ids=torch.ones((1, 9), dtype=torch.long), cache_position=torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 9]))
    with pytest.raises(ProgramInputError, match=r"the inputs must hold the same number of tokens"):
        loaded(input_ids=torch.ones((1, 3), dtype=torch.long), cache_position=torch.arange(4))
    with pytest.raises(ProgramInputError, match=r"the inputs must hold the same number of tokens, at least one"):
        loaded(input_ids=torch.ones((1, 0), dtype=torch.long), cache_position=torch.arange(0))
    with pytest.raises(ProgramInputError, match=r"input 1 \('cache_position'\) must be torch.int64"):
        loaded(input_ids=torch.ones((1, 2), dtype=torch.long), cache_position=torch.arange(2, dtype=torch.int32))
    # none of them wrote the cache: the same prompt gives the same logits
    assert torch.equal(loaded(input_ids=ids, cache_position=torch.arange(5)), first)
    with pytest.raises(InputValueError, match="goes backwards"):
        loaded(input_ids=ids, cache_position=torch.arange(5))


def test_programs_that_cannot_take_a_dynamic_token_count_are_refused():
    batch = torch.export.Dim("batch", min=1, max=8)
    mlp = torch.export.export(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
                              (torch.randn(2, 8),), dynamic_shapes=({0: batch},))
    with pytest.raises(LoweringError, match="not a decoder with a cache"):
        runtime.lower(mlp)
    two = torch.export.export(torch.nn.Linear(8, 8).eval(), (torch.randn(2, 8),),
                              dynamic_shapes=({0: torch.export.Dim("rows", min=2, max=8)},))
    with pytest.raises(LoweringError, match=r"ranges from 2; export it with torch.export.Dim\(..., min=1\)"):
        runtime.lower(two)


def test_token_sizes_must_hold_one(tmp_path):
    llm_models.import_transformers()
    exported = llm_models.export_decoder(llm_models.quantize_8da4w(
        llm_models.decoder(config_file(tmp_path, "llama"))), CACHE, dynamic=True)
    with pytest.raises(LoweringError, match=r"token_sizes \[4, 8\]: they must hold 1"):
        runtime.lower(exported, token_sizes=[4, 8])
    with pytest.raises(LoweringError, match=r"lie within the export's range \[1, 16\]"):
        runtime.lower(exported, token_sizes=[1, 32])
    program = runtime.lower(exported, token_sizes=[1, 4])
    assert sorted(program.specializations) == [4]


def test_large_outputs_the_host_reads_are_written_to_host_memory(dynamic):
    """Logits larger than DIRECT_READ_LIMIT (the 16-token graph's in fp32: 6 KiB) go straight to
    host memory, not through a staging copy; smaller ones (one token: 384 bytes) are read from
    device memory directly; hidden states stay in the planned device buffers."""
    family, _, program, path = dynamic
    loaded = runtime.load(path)
    for size in (1, 16):
        graph = loaded._graph(size)
        values = graph.recording.device_values
        logits = values[graph.program.outputs[0]]
        want = "host" if logits.nbytes > DIRECT_READ_LIMIT else "auto"
        assert logits.memory.placement == want, (family, size)
        hidden = [n.outputs[0] for n in graph.program.nodes if n.target == "etvk.embedding.default"]
        assert {values[h].memory.placement for h in hidden} == {"auto"}
    if program.values[program.outputs[0]].dtype == torch.float32:
        graph = loaded._graph(16)
        assert graph.recording.device_values[graph.program.outputs[0]].memory.placement == "host"


def test_last_token_downloads_the_last_logits_alone(dynamic, tmp_path):
    """`last_token` returns the last token's row of what a call returns, bit for bit, and writes
    the cache as the call does (the next step agrees); a static program refuses it."""
    _, _, _, path = dynamic
    loaded = runtime.load(path)
    prompt = dict(input_ids=torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]), cache_position=torch.arange(11))
    step = dict(input_ids=torch.tensor([[7]]), cache_position=torch.tensor([11]))
    full = loaded(**prompt)
    after_full = loaded(**step)
    loaded.reset()
    last = loaded.last_token(**prompt)
    assert last.shape == (1, 1, VOCAB) and torch.equal(last, full[:, -1:])
    assert torch.equal(loaded.last_token(**step), after_full)
    llm_models.import_transformers()
    static = runtime.lower(llm_models.export_decoder(llm_models.quantize_8da4w(
        llm_models.decoder(config_file(tmp_path, "llama"))), CACHE))
    static.save(tmp_path / "static.etvk")
    with pytest.raises(ProgramInputError, match="last_token needs a program with a dynamic token count"):
        runtime.load(tmp_path / "static.etvk").last_token(**step)


def test_the_last_token_graph_runs_the_tail_on_the_last_row(dynamic, tmp_path):
    """Lowered for 1, 2 and 4 tokens, each count of more than one token gets a last-token graph:
    the last layer's output projection and MLP, the final norm and the lm_head on one row, in the
    full graph's buffers. `last_token` runs them for every chunk of prompts of 1 to 16 tokens
    (16: four chunks of 4), bit-identical to the last row of a full call, and leaves the same
    cache (the next decode step agrees bit for bit)."""
    family, exported, _, _ = dynamic
    runtime.lower(exported, token_sizes=[1, 2, 4]).save(tmp_path / "small.etvk")
    loaded = runtime.load(tmp_path / "small.etvk")
    layers = COMMON["num_hidden_layers"]
    for size in (2, 4):
        full, last = loaded._graph(size), loaded._graph(size, last_token=True)
        assert last is not full and last.program.tokens == size
        rows = {n.name: last.program.values[n.outputs[0]].shape for n in last.program.nodes}
        attention = [n.name for n in last.program.nodes if n.target == "etvk.cache_attention.default"]
        linears = [n.name for n in last.program.nodes if n.target == "etvk.linear_qta8a_qga4w.default"]
        assert len(attention) == layers and all(rows[a][1] == size for a in attention), family
        # per layer q, k, v, o, gate, up, down (Phi-3's fused ones split), then the lm_head: after
        # the last attention the output projection, the MLP and the lm_head hold one row
        assert [rows[n][1] for n in linears[-5:]] == [1] * 5 and rows[linears[-6]][1] == size, family
        assert last.program.values[last.program.outputs[0]].shape == (1, 1, VOCAB)
        assert [r["node"] for r in loaded.placement(size, last_token=True) if r["runs_on"] != "vulkan"] == []
        # the memory plan does not grow, and its buffers are the full graph's
        plan, full_plan = loaded.memory_plan(size, last_token=True), loaded.memory_plan(size)
        assert plan["planned_bytes"] <= full_plan["planned_bytes"], family
        assert {id(b) for b in last.slots} <= {id(b) for b in full.slots}, family
    assert loaded._graph(1, last_token=True) is loaded._graph(1)  # one token: the full graph
    step = dict(input_ids=torch.tensor([[7]]))
    for tokens in (1, 2, 3, 4, 5, 7, 11, 16):
        ids = torch.randint(0, VOCAB, (1, tokens), generator=torch.Generator().manual_seed(tokens))
        prompt = dict(input_ids=ids, cache_position=torch.arange(tokens))
        loaded.reset()
        full = loaded(**prompt)
        after_full = loaded(**step, cache_position=torch.tensor([tokens])) if tokens < CACHE else None
        loaded.reset()
        last = loaded.last_token(**prompt)
        assert last.shape == (1, 1, VOCAB) and torch.equal(last, full[:, -1:]), (family, tokens)
        ran = [graph for graph, _ in loaded._last_call]
        assert [g.program.tokens for g in ran] == chunks(tokens, [1, 2, 4]), (family, tokens)
        assert all(g is loaded._graph(g.program.tokens, last_token=True) for g in ran)
        if after_full is not None:
            assert torch.equal(loaded(**step, cache_position=torch.tensor([tokens])), after_full), (family, tokens)


def test_a_cut_that_cannot_be_copied_stays_out_of_the_tail(dynamic):
    """Where a value the tail reads cannot be copied row by row (here marked int8 in both graphs),
    its readers keep every row and the tail starts after them; the lm_head still runs on one row.
    A one-token graph has no last-token graph."""
    _, _, program, _ = dynamic
    graph = program.specializations[4]
    cuts = [n.args[0].name for n in last_token_program(graph, program).nodes if n.name.endswith("__rows")]
    stuck = cuts[-1]
    graph, decode = graph.copy(), program.copy()
    for p in (graph, decode):
        p.values[stuck] = ValueSpec(p.values[stuck].shape, torch.int8)
    last = last_token_program(graph, decode)
    assert stuck not in [n.args[0].name for n in last.nodes if n.name.endswith("__rows")]
    readers = [n for n in last.nodes if stuck in n.reads()]
    assert readers and all(last.values[o] == graph.values[o] for n in readers for o in n.outputs)
    assert last.values[last.outputs[0]].shape == (1, 1, VOCAB)
    assert last_token_program(program, program) is None
