"""A decoder exported with a dynamic token count: one lowered graph per count, calls in chunks.

``TorchExportableModuleForDecoderOnlyLM(...).export(..., dynamic_shapes=...)``
with a dynamic dimension on ``input_ids`` and ``cache_position`` gives one
graph whose shapes hold a size symbol T (the tokens of a call). A runtime
program records fixed shapes, so the lowering converts that graph for a
few token counts (`token_sizes`: one, then powers of two up to the
export's bound and `MAX_CHUNK`) and `combine` makes them one `Program`:
the program for the smallest count, with the others in its
``specializations``, all sharing its constants (the same tensors: one copy
in the file and on the device; a constant folded differently for a count
gets its own name) and its state. A call of T tokens runs in chunks of
the counts the program has, largest first (runtime.programs.chunking),
each writing its tokens into the cache before the next reads them.

That is exact for a causal decoder, whose tokens see each other only
through the cache; `combine` checks that each graph is one (state, and
cache positions checked as consecutive on a token input) and refuses any
other dynamic program. Pure graph work; used by lower.py.
"""

from __future__ import annotations

from torch.export import ExportedProgram
from torch.export import graph_signature as sig

from runtime.programs.from_export import LoweringError
from runtime.programs.program import Program

MAX_CHUNK = 512  # the largest token count lowered by default (a long prompt runs in chunks of it)


def token_dims(exported: ExportedProgram) -> tuple[object, dict[str, int], list[int | None]] | None:
    """The token symbol of a program with dynamic shapes, the dimension of each user input and
    each user output that it sizes; None for a program with static shapes.

    Raises:
        LoweringError: more than one size symbol, or an input dimension that is an
            expression of it rather than the symbol itself.
    """
    users = {s.arg.name for s in exported.graph_signature.input_specs
             if s.kind == sig.InputKind.USER_INPUT and isinstance(s.arg, sig.TensorArgument)}
    symbols, inputs = set(), {}
    for node in exported.graph.nodes:
        if node.op != "placeholder" or node.name not in users:
            continue
        for dim, size in enumerate(node.meta["val"].shape):
            if isinstance(size, int):
                continue
            expr = size.node.expr
            if not expr.is_Symbol:
                raise LoweringError(f"input {node.name}: dimension {dim} is {expr}; a dynamic dimension "
                                    "must be a plain size (the tokens of a call)")
            symbols.add(expr)
            inputs[node.name] = dim
    if not symbols:
        return None
    if len(symbols) > 1:
        raise LoweringError(f"the program has {len(symbols)} dynamic sizes ({', '.join(sorted(map(str, symbols)))}); "
                            "a runtime program may have one, the tokens of a call")
    symbol = symbols.pop()
    output = next(n for n in exported.graph.nodes if n.op == "output")
    outputs = []
    for value, spec in zip(output.args[0], exported.graph_signature.output_specs, strict=True):
        if spec.kind != sig.OutputKind.USER_OUTPUT:
            continue
        shape = value.meta["val"].shape
        outputs.append(next((d for d, s in enumerate(shape) if not isinstance(s, int)
                             and s.node.expr == symbol), None))
    return symbol, inputs, outputs


def token_sizes(exported: ExportedProgram, symbol, requested: list[int] | None = None) -> list[int]:
    """The token counts to lower: `requested`, checked, or 1, 2, 4, ... up to the export's bound
    and `MAX_CHUNK`.

    Raises:
        LoweringError: the export does not allow one token a call, or a requested count is
            outside its range or `requested` lacks 1.
    """
    bounds = exported.range_constraints[symbol]
    low, high = int(bounds.lower), bounds.upper
    if low > 1:
        raise LoweringError(f"the token count of a call ranges from {low}; export it with "
                            "torch.export.Dim(..., min=1) so that the program can decode one token")
    if requested is not None:
        sizes = sorted(set(requested))
        if 1 not in sizes or any(not isinstance(s, int) or s > high for s in sizes):
            raise LoweringError(f"token_sizes {requested}: they must hold 1 (decode, and the rest of a "
                                f"prompt) and lie within the export's range [1, {high}]")
        return sizes
    sizes, size = [], 1
    while size <= MAX_CHUNK and size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def combine(programs: dict[int, Program], inputs: dict[str, int], outputs: list[int | None]) -> Program:
    """One program from the lowered graph of each token count (module docstring).

    Raises:
        LoweringError: a graph that is not a causal decoder.
    """
    for size, program in programs.items():
        consecutive = {c.input for c in program.input_checks if c.kind == "consecutive"}
        positions = {c.input for c in program.input_checks if c.kind == "position"}
        if not program.state or not positions & consecutive & set(inputs):
            raise LoweringError(f"the program for {size} tokens a call is not a decoder with a cache "
                                "(state written at consecutive positions of a dynamic input): only such "
                                "a program can take a dynamic token count; export it with static shapes")
    first, *others = sorted(programs)
    main = programs[first]
    for size in others:
        program = programs[size]
        renamed = {}
        for name, tensor in program.constants.items():
            known = main.constants.setdefault(name, tensor)
            if not _same(known, tensor):  # folded for this count (a mask, a table): its own name
                renamed[name] = f"{name}__tokens{size}"
                main.constants[renamed[name]] = tensor
        if renamed:
            program.rename_constants(renamed)
        program.constants = main.constants
        program.state = main.state
        main.specializations[size] = program
    for program in programs.values():
        program.token_inputs, program.token_outputs = dict(inputs), list(outputs)
    return main


def _same(a, b) -> bool:
    """Whether two constant tensors hold the same values (the same memory, or equal)."""
    if a is b:
        return True
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return (a.data_ptr() == b.data_ptr() and a.stride() == b.stride()) or bool((a == b).all())
