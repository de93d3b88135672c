"""``python -m runtime export-llm | generate``: decoder LLMs from the command line.

- ``export-llm SOURCE --out FILE``: a causal LM from a preset (random
  weights, e.g. ``llama-3.2-1b``), a ``config.json`` or a local folder with
  its safetensors weights, quantized 8da4w, exported with a static KV cache
  and a dynamic token count (runtime.tools.llm_models), lowered for 1, 2,
  4, ... up to ``--max-prefill`` tokens a call, and saved;
- ``generate FILE --prompt 1,2,3 --max-new-tokens N``: greedy generation
  (runtime.programs.generate), printing the new tokens, the time to the
  first token, and prefill and decode tokens per second.

Progress goes to stderr, results to stdout; errors are `EtvkError`s for the
CLI to print as one line. Called by runtime.tools.cli.
"""

from __future__ import annotations

import time
from pathlib import Path

from runtime.programs.generate import generate_timed
from runtime.programs.loader import load
from runtime.programs.lower import lower
from runtime.tools.program_commands import CommandError, node_counts, progress, save


def export_llm(source: str, out: Path, max_cache_len: int, group_size: int, layers: int | None,
               seed: int, max_prefill: int = 128) -> int:
    """Builds, quantizes, exports, lowers and saves a decoder; returns the exit status."""
    from runtime.tools.llm_models import decoder, export_decoder, quantize_8da4w

    if max_cache_len < 1:
        raise CommandError(f"--max-cache-len must be at least 1, got {max_cache_len}")
    if max_prefill < 1:
        raise CommandError(f"--max-prefill must be at least 1, got {max_prefill}")
    max_prefill = min(max_prefill, max_cache_len)  # a call holds at most the cache
    sizes = [1 << k for k in range(max_prefill.bit_length()) if 1 << k <= max_prefill]
    started = time.perf_counter()

    def step(text: str) -> None:
        progress(f"[{time.perf_counter() - started:6.1f} s] {text}")

    step(f"building {source}" + (f" with {layers} layers" if layers else ""))
    model = decoder(source, seed, num_hidden_layers=layers)
    count = sum(p.numel() for p in model.parameters())
    step(f"built {type(model).__name__}: {count / 1e6:,.1f} M parameters; quantizing 8da4w "
         f"(group size {group_size})")
    model = quantize_8da4w(model, group_size)
    step(f"exporting with a static cache of {max_cache_len} positions"
         + (", a dynamic token count" if max_prefill > 1 else ", one token a call"))
    exported = export_decoder(model, max_cache_len, dynamic=max_prefill > 1)
    del model
    step("lowering" + (f" for {', '.join(map(str, sizes))} tokens a call" if max_prefill > 1 else ""))
    program = lower(exported, token_sizes=sizes)
    del exported
    step(f"saving {out}")
    save(program, out)
    counts = f", graphs for {', '.join(map(str, sizes))} tokens a call" if program.specializations else ""
    print(f"saved {out} ({out.stat().st_size / 2**20:,.1f} MiB): {node_counts(program)}, "
          f"{len(program.state)} state tensors{counts}")
    return 0


def _prompt(text: str) -> list[int]:
    try:
        tokens = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise CommandError(f"--prompt must be token ids separated by commas, got {text!r}") from None
    if not tokens:
        raise CommandError("--prompt is empty")
    return tokens


def generate(path: Path, prompt: str, max_new_tokens: int, eos: int | None) -> int:
    """Loads a decoder program and generates greedily; returns the exit status."""
    tokens = _prompt(prompt)
    loaded = load(path, progress=progress)
    result = generate_timed(loaded, tokens, max_new_tokens, eos)
    print(",".join(map(str, result.tokens)))
    first = f"time to first token {result.prefill_seconds * 1e3:.1f} ms"
    prefill = f"prefill {len(tokens) / result.prefill_seconds:,.1f} tokens/s" if result.prefill_seconds else ""
    decoded = len(result.tokens) - 1
    decode = f"decode {decoded / result.decode_seconds:,.1f} tokens/s" if decoded and result.decode_seconds \
        else "decode: no second token"
    print(f"{path} on {loaded.device.caps.name}: {len(tokens)} prompt tokens, {len(result.tokens)} new; "
          f"{first}; {prefill}; {decode}")
    return 0
