"""The positions of a decoder export, on the device: read as the position input, and tables.

Hugging Face computes a call's positions as ``arange(S) + cache_position[0]``
and the rotary cos and sin from them on every call. `consecutive_positions`
reads such positions as the position input itself, which must then hold
consecutive values (an input check says so); `position_tables` turns a
value computed from the positions alone by position-wise ops into a gather
from a table of its values at every cache position, computed at lowering
time with the same ops (bit for bit what the CPU would compute). Pure graph
work; used by lower_decoder.py.
"""

from __future__ import annotations

import torch

from runtime.programs.cpu import run_node
from runtime.programs.nodes import Const, InputCheck, Node, Ref, ValueSpec
from runtime.programs.rewrite import FLOATS, Rewriter

# Ops that act on each position alone (a value computed from positions by these alone, with
# constants, is a function of each position: a table of every position can stand for it).
_POSITIONWISE = {"aten.unsqueeze.default", "aten.to.dtype", "aten.to.dtype_layout", "aten._to_copy.default",
                 "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.div.Tensor",
                 "aten.cat.default", "aten.neg.default", "aten.cos.default", "aten.sin.default"}


def consecutive_positions(rw: Rewriter, lengths: dict[str, int]) -> None:
    """``arange(S) + x[0]`` (the first position, perhaps copied into a scalar buffer first) is x
    itself, for a position input x of S values that must be consecutive: its check says so."""
    program = rw.program
    for node in list(program.nodes):
        if node.target != "aten.add.Tensor" or len(node.args) != 2 or node not in program.nodes:
            continue
        for counted, offset in (node.args, node.args[::-1]):
            arange = rw.made_by(counted, "aten.arange.default")
            copy = rw.made_by(offset, "aten.copy.default")
            select = rw.made_by(copy.args[1] if copy else offset, "aten.select.int")
            x = select.args[0] if select else None
            if arange is None or select is None or select.args[1:] != (0, 0) or x.name not in lengths \
                    or (copy and not (isinstance(copy.args[0], Const) and rw.value_spec(copy.args[0]).shape == ()
                                      and rw.value_spec(copy.args[0]).dtype == program.values[x.name].dtype)) \
                    or program.values[x.name].shape != (arange.args[0],) \
                    or program.values[node.outputs[0]] != program.values[x.name]:
                continue
            program.replace_uses(node.outputs[0], x.name)
            program.nodes.remove(node)
            program.input_checks.append(InputCheck(x.name, "consecutive", arange.args[0]))
            rw.refresh()
            break


def position_tables(rw: Rewriter, lengths: dict[str, int]) -> None:
    """A ``[1, S, D]`` value computed from a position input x ``[S]`` and constants by
    position-wise ops alone (the rotary embedding's cos and sin, with the scaling and cast after
    them) becomes a gather from the table of its values at every position 0..L-1, computed now
    with the same ops: bit for bit the same."""
    program = rw.program
    for node in list(program.nodes):
        if node.target not in ("aten.cos.default", "aten.sin.default") or node not in program.nodes:
            continue
        node = _last_positionwise(rw, node)
        chain, sources = _positionwise_chain(rw, node)
        spec = program.values[node.outputs[0]]
        if len(sources) != 1 or len(spec.shape) != 3 or spec.shape[0] != 1 or spec.dtype not in FLOATS:
            continue
        (x,) = sources
        length, positions = lengths[x], program.values[x].shape[0]
        env = {x: torch.arange(length, dtype=program.values[x].dtype)}
        try:
            for step in chain:
                run_node(step, env, program.constants)
        except (RuntimeError, IndexError):  # not shape-agnostic in the positions after all
            continue
        table = env[node.outputs[0]]
        if tuple(table.shape) != (1, length, spec.shape[2]) or spec.shape[1] != positions:
            continue
        constant = rw.add_constant(f"{node.outputs[0]}_table", table[0].contiguous())
        rows = f"{node.outputs[0]}_rows"
        program.values[rows] = ValueSpec((positions, spec.shape[2]), spec.dtype)
        index = program.nodes.index(node)
        program.nodes[index:index + 1] = [
            Node(f"{node.name}_gather", "etvk.embedding.default", (constant, Ref(x)), {}, (rows,)),
            Node(f"{node.name}_view", "aten.view.default", (Ref(rows), list(spec.shape)), {}, node.outputs)]
        rw.refresh()


def _last_positionwise(rw: Rewriter, node: Node) -> Node:
    """`node`, or the last of the nodes after it that are each the only reader of the one
    before, position-wise, read nothing else but constants and keep its shape (the rotary
    module's ``* attention_scaling``, the cast to the model's dtype)."""
    while (user := rw.only_user(node)) is not None and user.target in _POSITIONWISE \
            and user.reads() == [node.outputs[0]] \
            and rw.program.values[user.outputs[0]].shape == rw.program.values[node.outputs[0]].shape:
        node = user
    return node


def _positionwise_chain(rw: Rewriter, node: Node) -> tuple[list[Node], set[str]]:
    """The nodes `node` is computed from by position-wise ops (program order), and the program
    inputs they start from; an empty source set where anything else feeds them."""
    chain, sources, work = {}, set(), [node]
    while work:
        item = work.pop()
        if item.name in chain:
            continue
        if item.target not in _POSITIONWISE:
            return [], set()
        chain[item.name] = item
        for ref in item.reads():
            if ref in rw.program.inputs:
                sources.add(ref)
            elif ref in rw.producers:
                work.append(rw.producers[ref])
            else:
                return [], set()
    order = {n.name: i for i, n in enumerate(rw.program.nodes)}
    return sorted(chain.values(), key=lambda n: order[n.name]), sources
