"""Calls of a program with a dynamic token count, in chunks (runtime.programs.token_counts).

A call of T tokens runs as graphs of the token counts the program has,
largest first: `split_call` narrows each token input to a chunk's tokens,
`join_outputs` joins the chunks' outputs along each output's token
dimension. Exact for a causal decoder, whose tokens see each other only
through the cache each chunk writes before the next reads it. Pure; used
by the loader and `Program.run_reference`.
"""

from __future__ import annotations

import torch


def chunks(tokens: int, sizes: list[int]) -> list[int]:
    """`tokens` as a sum of `sizes` (which hold 1), largest first."""
    parts = []
    for size in sorted(sizes, reverse=True):
        while tokens >= size:
            parts.append(size)
            tokens -= size
    return parts


def split_call(program, inputs: tuple, tokens: int) -> list[tuple[int, tuple]]:
    """A call of `tokens` tokens of a program with a dynamic token count as its chunks, in
    order: (token count, the inputs with each token input narrowed to the chunk's tokens)."""
    parts, start = [], 0
    for size in chunks(tokens, [program.tokens, *program.specializations]):
        parts.append((size, tuple(value.narrow(program.token_inputs[name], start, size)
                                  if name in program.token_inputs else value
                                  for name, value in zip(program.inputs, inputs, strict=True))))
        start += size
    return parts


def join_outputs(program, results: list):
    """The outputs of a call from its chunks' (each a tensor or a tuple, as the program returns):
    joined along each output's token dimension; an output without one is the last chunk's."""
    if len(results) == 1:
        return results[0]
    joined = []
    for index, dim in enumerate(program.token_outputs):
        pieces = [r[index] if program.output_tuple else r for r in results]
        joined.append(pieces[-1] if dim is None else torch.cat(pieces, dim))
    return tuple(joined) if program.output_tuple else joined[0]
