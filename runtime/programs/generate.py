"""Greedy generation with a loaded decoder program: `runtime.generate`.

A decoder program (a causal LM exported with a static KV cache) has two
inputs that its input checks name (runtime.programs.input_checks): the
token ids (``index``: an embedding reads them) and the cache positions
(``position``: the cache is written at them), and returns logits
``[1, T, vocab]``. `generate` resets the program's state, feeds the prompt
(in one call for a program with a dynamic token count, else T tokens a
call: one at a time for a program exported for one token),
then appends the argmax of the last logits until `max_new_tokens` or an
end-of-sequence token, timing prefill and decode. Called by users and the
``generate`` command; never touches Vulkan itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from runtime.errors import EtvkError


class GenerationError(EtvkError, ValueError):
    """A generation request a program cannot serve: names the argument or the program's fault."""


@dataclass
class Generation:
    """What `generate_timed` produced: the new tokens and where the time went.

    Attributes:
        tokens: the generated token ids (not the prompt).
        prefill_seconds: from the first prompt call to the first new token's logits.
        decode_seconds: the calls after that (one per further token).
    """

    tokens: list[int]
    prefill_seconds: float
    decode_seconds: float


def decoder_inputs(program) -> tuple[str, str, int]:
    """(token-id input, position input, tokens per call) of a decoder program.

    Raises:
        GenerationError: the program has no such pair of inputs.
    """
    kinds = {c.kind: c.input for c in program.input_checks if c.kind in ("index", "position")}
    if len(kinds) != 2 or len(program.inputs) != 2 or len(program.outputs) != 1:
        raise GenerationError("generate needs a decoder program: token ids and cache positions in, "
                              f"logits out; this one takes {', '.join(program.inputs)}")
    ids, positions = kinds["index"], kinds["position"]
    ids_shape, positions_shape = program.values[ids].shape, program.values[positions].shape
    if len(ids_shape) != 2 or ids_shape[0] != 1 or positions_shape != (ids_shape[1],):
        raise GenerationError(f"generate needs token ids [1, T] and positions [T]; the program takes "
                              f"{ids!r} {list(ids_shape)} and {positions!r} {list(positions_shape)}")
    return ids, positions, ids_shape[1]


def generate_timed(loaded, prompt_ids, max_new_tokens: int, eos_token_id=None) -> Generation:
    """`generate`, with the prefill and decode times.

    Raises:
        GenerationError: an empty prompt, a prompt the program's call size does not divide,
            more tokens than the cache holds, or a program that is not a decoder.
    """
    program = loaded.program
    ids_name, positions_name, width = decoder_inputs(program)
    prompt = [int(t) for t in (prompt_ids.reshape(-1).tolist() if isinstance(prompt_ids, torch.Tensor)
                                else prompt_ids)]
    if not prompt:
        raise GenerationError("prompt_ids is empty")
    if max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if len(prompt) % width or (max_new_tokens > 1 and width != 1):
        raise GenerationError(f"the program takes {width} tokens a call: it can prefill prompts of a "
                              f"multiple of {width} tokens and decode only with 1 (prompt of "
                              f"{len(prompt)}, max_new_tokens {max_new_tokens})")
    capacity = next(c.bound for c in program.input_checks if c.kind == "position")
    if len(prompt) + max_new_tokens - 1 > capacity:
        raise GenerationError(f"prompt_ids ({len(prompt)} tokens) and max_new_tokens ({max_new_tokens}) "
                              f"need {len(prompt) + max_new_tokens - 1} cache positions; the cache "
                              f"holds {capacity}")
    stops = set() if eos_token_id is None else \
        {int(eos_token_id)} if isinstance(eos_token_id, int) else {int(t) for t in eos_token_id}
    ids_dtype, positions_dtype = program.values[ids_name].dtype, program.values[positions_name].dtype

    # a dynamic token count: the last-token graphs, the last token's logits alone downloaded
    call = loaded.last_token if program.token_inputs else loaded

    def step(tokens: list[int], start: int) -> int:
        logits = call(**{ids_name: torch.tensor([tokens], dtype=ids_dtype),
                         positions_name: torch.arange(start, start + len(tokens), dtype=positions_dtype)})
        return int(torch.argmax(logits[0, -1]))

    loaded.reset()
    started = time.perf_counter()
    new: list[int] = []
    if max_new_tokens == 0:
        return Generation(new, 0.0, 0.0)
    prefill = len(prompt) if program.token_inputs else width  # a dynamic count takes it whole
    for start in range(0, len(prompt), prefill):
        token = step(prompt[start:start + prefill], start)
    prefilled = time.perf_counter()
    new.append(token)
    while len(new) < max_new_tokens and token not in stops:
        token = step([token], len(prompt) + len(new) - 1)
        new.append(token)
    return Generation(new, prefilled - started, time.perf_counter() - prefilled)


def generate(loaded, prompt_ids, max_new_tokens: int, eos_token_id=None) -> list[int]:
    """Greedy generation: the new token ids after `prompt_ids` (the prompt not included).

    Args:
        loaded: a `LoadedProgram` of a decoder (token ids and cache positions in, logits out).
        prompt_ids: the prompt's token ids (a list or a tensor).
        max_new_tokens: how many tokens to generate at most.
        eos_token_id: a token id (or several) that ends generation; it is returned last.

    Raises:
        GenerationError: see `generate_timed`.
        runtime.programs.input_checks.InputValueError: a prompt token outside the vocabulary.
    """
    return generate_timed(loaded, prompt_ids, max_new_tokens, eos_token_id).tokens
