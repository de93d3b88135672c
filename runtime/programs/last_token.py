"""The last-token graph of a decoder's token count: its per-token tail on the last row alone.

What `LoadedProgram.last_token` runs (generation reads the last token's
logits only). A decoder's graph for T tokens ends in a tail of ops that
treat each token's row on its own (the final RMSNorm and the lm_head, and
before them the last layer's output projection and MLP), after the last op
that mixes tokens (attention over the cache). `last_token_program` keeps
the graph up to that tail as it is, takes the last row of each value the
tail reads from it (the cuts) and runs the tail on that row: the tail's
nodes as the one-token graph of the same program has them, whose lowering
already derived every shape for one row. A cut's last row is taken on the
device as a bit copy: the value viewed as ``[T, F]`` and ``etvk.embedding``
of row T - 1, viewed back as the one-token graph's value.

A node belongs to the tail when its op computes each row of its outputs
from the same row of its inputs alone, in an order that does not depend on
how many rows there are (`ROW_WISE`, `ELEMENTWISE` and the views: each op's
contract in docs/llm_ops.md fixes its order per row or per value), when
every value it touches has its token dimension first but for leading 1s
(a row is then one contiguous block) or does not grow with the tokens,
when all its outputs are read by tail nodes or are token outputs (no state
update, no other output), and when the one-token graph has the same node.
So the tail's results are those of the full graph's last row, bit for bit.
A cut that cannot be copied so (not fp32 or fp16: an int8 activation, a
token input) leaves the nodes reading it out of the tail. Pure graph work;
used by loader.py when it loads a program with a dynamic token count.
"""

from __future__ import annotations

import dataclasses

import torch

from runtime.ops.registry import get_op
from runtime.programs.nodes import Const, Node, Ref, ValueSpec, map_args
from runtime.programs.program import Program
from runtime.programs.recording import VIEWS

# Ops that compute each row (all dimensions but the last) of their outputs from the same row of
# their first input (and of their other inputs with a token dimension) over its last dimension.
ROW_WISE = frozenset({
    "etvk.linear.default", "etvk.linear_qta8a_qga4w.default", "etvk.rms_norm.default",
    "etvk.rms_norm_quantize.default", "etvk.add_rms_norm_quantize.default",
    "etvk.act_mul_quantize.default", "etvk.quantize_affine_per_token_dynamic.default",
    "etvk.quantize_per_token_dynamic.default"})
# Ops that compute each value from the values at the same (broadcast) index alone.
ELEMENTWISE = frozenset({"etvk.binary.default", "etvk.scalar.default", "etvk.cast.default",
                         "etvk.act_mul.default"})
_COPY = "etvk.embedding.default"  # out = weight[indices], bits copied: a row of a [T, F] view
_VIEW = "aten.reshape.default"


def last_token_program(graph: Program, decode: Program) -> Program | None:
    """The last-token graph of `graph` (a token count's graph of a program with a dynamic token
    count, more than one token) given `decode`, the program's one-token graph; None where it
    has no tail to cut (one token, no output with a token dimension, outputs other than the
    one-token graph's, no node in the tail, or a name the graph needs taken)."""
    tokens = graph.tokens
    if tokens is None or tokens == 1 or decode.tokens != 1 or list(decode.outputs) != list(graph.outputs):
        return None
    dims = _token_dims(graph, decode)
    outputs = {n for n, d in zip(graph.outputs, graph.token_outputs, strict=True) if d is not None}
    if not outputs or not outputs <= set(dims):
        return None
    tail = _tail(graph, decode, dims, outputs)
    if not tail:
        return None
    return _assemble(graph, decode, dims, outputs, tail)


def _token_dims(graph: Program, decode: Program) -> dict[str, int]:
    """Each value of `graph` that grows with the tokens -> its token dimension: the one where
    its shape holds T and the one-token graph's holds 1 (its shapes agreeing elsewhere), with
    only 1s before it (a row is one contiguous block)."""
    dims = {}
    for name, spec in graph.values.items():
        other = decode.values.get(name)
        if other is None or len(other.shape) != len(spec.shape) or other.dtype != spec.dtype:
            continue
        differ = [d for d, (a, b) in enumerate(zip(spec.shape, other.shape, strict=True)) if a != b]
        if len(differ) == 1 and (spec.shape[differ[0]], other.shape[differ[0]]) == (graph.tokens, 1) \
                and all(s == 1 for s in spec.shape[:differ[0]]):
            dims[name] = differ[0]
    return dims


def _tail(graph: Program, decode: Program, dims: dict[str, int], outputs: set[str]) -> set[str]:
    """The names of the tail's nodes (module docstring)."""
    readers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for name in node.reads():
            readers.setdefault(name, set()).add(node.name)
    kept = set(graph.state_updates.values()) | (set(graph.outputs) - outputs)
    twins = {n.name: n for n in decode.nodes}
    candidates = {n.name for n in graph.nodes if not kept & set(n.outputs)
                  and _per_row(n, twins.get(n.name), graph, decode, dims)}
    while True:
        tail: set[str] = set()
        for node in reversed(graph.nodes):  # read by tail nodes alone, and read
            if node.name in candidates and all(readers.get(o, set()) <= tail for o in node.outputs) and \
                    any(o in outputs or o in readers for o in node.outputs):
                tail.add(node.name)
        made = {o for n in graph.nodes if n.name in tail for o in n.outputs}
        # the readers of a cut that cannot be copied leave, and what only they read with them
        stuck = {n.name for n in graph.nodes if n.name in tail and any(
            r in dims and r not in made and not _copyable(graph.values[r]) for r in n.reads())}
        if not stuck:
            return tail
        candidates -= stuck


def _per_row(node: Node, twin: Node | None, graph: Program, decode: Program, dims: dict[str, int]) -> bool:
    """Whether `node` computes each token's row on its own, as `twin` (the one-token graph's node
    of its name) does on one row."""
    if twin is None or twin.target != node.target or twin.outputs != node.outputs:
        return False
    values = [*node.reads(), *node.outputs]
    if any(v not in dims and graph.values[v] != decode.values.get(v) for v in values):
        return False  # a value whose shapes the two graphs do not relate by its token dimension
    if node.target in VIEWS:  # row t of the input is row t of the output: the same block
        return node.args[0] == twin.args[0] and node.args[0].name in dims and node.outputs[0] in dims
    if (node.args, node.kwargs) != (twin.args, twin.kwargs):
        return False
    if node.target in ELEMENTWISE:  # the token dimensions meet under broadcasting
        return len({len(graph.values[v].shape) - dims[v] for v in values if v in dims}) == 1
    first = node.args[0]
    return node.target in ROW_WISE and isinstance(first, Ref) and first.name in dims and \
        dims[first.name] < len(graph.values[first.name].shape) - 1


def _copyable(spec: ValueSpec) -> bool:
    """Whether `etvk.embedding` can copy a row of the value (a plain fp32 or fp16 tensor)."""
    return spec.dtype in (torch.float32, torch.float16) and spec.layout is None


def _assemble(graph: Program, decode: Program, dims: dict[str, int], outputs: set[str],
              tail: set[str]) -> Program | None:
    """`graph` with its tail on the last row: the other nodes, a copy of each cut's last row,
    then the one-token graph's tail nodes reading those copies (None: a name they need is taken)."""
    made = {o for n in graph.nodes if n.name in tail for o in n.outputs}
    cuts = list(dict.fromkeys(
        [r for n in graph.nodes if n.name in tail for r in n.reads() if r in dims and r not in made] +
        [o for o in graph.outputs if o in outputs and o not in made]))
    index = f"last_token_row_{graph.tokens}"
    names = {cut: (f"{cut}__rows", f"{cut}__row", f"{cut}__last") for cut in cuts}
    taken = set(graph.values) | {n.name for n in graph.nodes}
    if index in graph.constants or taken & {n for triple in names.values() for n in triple}:
        return None
    nodes = [n for n in graph.nodes if n.name not in tail]
    values = dict(graph.values)
    for cut, (rows, row, last) in names.items():
        spec = graph.values[cut]
        flat = (graph.tokens, int(torch.Size(spec.shape[dims[cut] + 1:]).numel()))
        nodes += [Node(rows, _VIEW, (Ref(cut), list(flat)), {}, (rows,)),
                  Node(row, _COPY, (Ref(rows), Const(index)), {}, (row,)),
                  Node(last, _VIEW, (Ref(row), list(decode.values[cut].shape)), {}, (last,))]
        values.update({rows: ValueSpec(flat, spec.dtype), row: ValueSpec((1, flat[1]), spec.dtype),
                       last: decode.values[cut]})

    def read_copy(a):
        return Ref(names[a.name][2]) if isinstance(a, Ref) and a.name in names else a

    for twin in decode.nodes:
        if twin.name in tail:
            nodes.append(dataclasses.replace(twin, args=map_args(twin.args, read_copy),
                                             kwargs=map_args(twin.kwargs, read_copy)))
            values.update((o, decode.values[o]) for o in twin.outputs)
    return dataclasses.replace(
        graph, outputs=[names[o][2] if o in names else o for o in graph.outputs], nodes=nodes,
        values=values, constants={**graph.constants, index: torch.tensor([graph.tokens - 1])},
        op_schemas={**graph.op_schemas, _COPY: get_op(_COPY).schema},
        input_checks=list(graph.input_checks), specializations={})
