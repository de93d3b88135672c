"""``python -m runtime export | inspect | run``: programs from the command line.

- ``export NAME --out FILE``: a torchvision architecture (random weights),
  quantized with PT2E after a short calibration on random data, lowered and
  saved;
- ``inspect FILE``: every node, where it runs on this device and why, the
  layouts as resolved here, whether a conv runs with measured settings
  (``python -m runtime tune``) or the rule's, the memory plan, and where the
  program's state (a KV cache) lives;
- ``run FILE``: random or given inputs (token ids and cache positions in
  range where the program checks them), agreement with the same program run
  by PyTorch on the CPU (its ops, and the etvk reference kernels), timing
  (each call from the start state), and how many convs run measured choices.

Progress goes to stderr, results to stdout. Errors are raised as `EtvkError`s
for the CLI to print as one line. Called by runtime.tools.cli.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path

import torch

from runtime.errors import EtvkError
from runtime.ops.library import manifest_hash
from runtime.programs.loader import load
from runtime.programs.lower import lower
from runtime.programs.program import Program
from runtime.programs.recording import VIEWS
from runtime.tools.models import quantize_pt2e, torchvision_model


class CommandError(EtvkError, ValueError):
    """A bad command-line argument (a missing file, inputs that do not fit)."""


def progress(line: str) -> None:
    """One progress line on stderr (rewritten in place on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + line[:150])
        if not line.startswith("recording"):
            sys.stderr.write("\n")
    elif not line.startswith("recording"):
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _kib(nbytes: int) -> str:
    return f"{nbytes / 1024:,.0f} KiB"


def export(name: str, out: Path, size: int, batch: int, calibration: int, seed: int) -> int:
    """Builds, quantizes, lowers and saves a torchvision model; returns the exit status."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, 3, size, size)
    model = torchvision_model(name)
    progress(f"built {name} (random weights), input {list(shape)}")
    progress(f"quantizing with PT2E (XNNPACK symmetric per-channel), {calibration} calibration batches")
    started = time.perf_counter()
    exported = quantize_pt2e(model, (torch.randn(shape, generator=gen),),
                             [(torch.randn(shape, generator=gen),) for _ in range(calibration)])
    progress(f"lowering ({time.perf_counter() - started:.1f} s so far)")
    program = lower(exported)
    save(program, out)
    print(f"saved {out} ({out.stat().st_size / 2**20:.1f} MiB): {node_counts(program)}")
    return 0


def save(program: Program, out: Path) -> None:
    """`program.save(out)`, what the format cannot hold (a NaN argument, an op no reader runs)
    a `CommandError` naming the file."""
    try:
        program.save(out)
    except ValueError as exc:
        raise CommandError(f"{out}: the program cannot be saved: {exc}") from None


def node_counts(program: Program) -> str:
    """The program's nodes by kind: etvk ops, reshapes (`recording.VIEWS`: no compute, a view of
    the same buffer where the value is on the device) and the other PyTorch ops."""
    etvk = sum(n.is_etvk for n in program.nodes)
    views = sum(not n.is_etvk and n.target in VIEWS for n in program.nodes)
    return (f"{len(program.nodes)} nodes, {etvk} etvk ops, {views} reshapes, "
            f"{len(program.nodes) - etvk - views} other PyTorch ops")


def table(rows: list[list[str]]) -> str:
    """Rows of cells as text columns, left-aligned (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def inspect(path: Path) -> int:
    """Prints every node's placement, the memory plan, the state and the token counts; returns
    the exit status."""
    loaded = load(path, progress=progress)
    caps = loaded.device.caps
    same = "the same as" if loaded.program.manifest_hash == manifest_hash() else "differs from"
    rows = [["node", "target", "runs on", "op", "variant", "layout", "tuning", "reason"]]
    for r in loaded.placement():
        op = r["op"].removeprefix("etvk.").removesuffix(".default") if r["runs_on"] == "vulkan" else ""
        rows.append([r["node"], r["target"], r["runs_on"], op, r["variant"] or "", r["layout"] or "",
                     r["tuning"] or "", r["reason"]])
    plan = loaded.memory_plan()
    on_device = sum(r["runs_on"] == "vulkan" for r in loaded.placement())
    print(f"{path}: {len(loaded.program.nodes)} nodes, {on_device} on {caps.name} (family {caps.family}); "
          f"lowered with manifest {loaded.program.manifest_hash[:12]}, {same} this runtime's"
          + "".join(f", {name} {version}" for name, version in loaded.program.lowered_with.items()))
    print(table(rows))
    print(f"memory: {plan['tensors']} intermediates, {_kib(plan['unshared_bytes'])} if each had its own; "
          f"planned into {plan['buffers']} buffers of {_kib(plan['planned_bytes'])} "
          f"(peak live {_kib(plan['peak_bytes'])}); segment inputs {_kib(plan['input_bytes'])}")
    homes = loaded.state_placement()
    if homes:
        values = loaded.program.values
        nbytes = sum(math.prod(values[n].shape) * values[n].dtype.itemsize for n in homes)
        where = ", ".join(f"{sum(h == place for h in homes.values())} on {place}" for place in sorted(set(homes.values())))
        print(f"state: {len(homes)} tensors of {_kib(nbytes)} ({where})")
    counts = loaded.token_counts
    if counts:
        off = [size for size in counts if any(r["runs_on"] != "vulkan" for r in loaded.placement(size))]
        print(f"token counts: graphs for {', '.join(map(str, counts))} tokens a call (the table shows "
              f"{counts[0]}; a longer call runs in chunks of them); "
              + (f"nodes on the CPU for {', '.join(map(str, off))}" if off else "every graph fully on the device"))
    return 0


def program_inputs(program: Program, given: Path | None, seed: int) -> list[torch.Tensor]:
    """The program's inputs: those in the safetensors file `given`, else random ones from `seed`."""
    if given is None:  # random values, where a check bounds an input within its bounds
        gen = torch.Generator().manual_seed(seed)
        kinds = {c.input: c for c in program.input_checks if c.kind in ("index", "position")}
        inputs = []
        for name in program.inputs:
            spec, check = program.values[name], kinds.get(name)
            if check is None:
                inputs.append(torch.randn(spec.shape, generator=gen).to(spec.dtype))
            elif check.kind == "index":
                inputs.append(torch.randint(0, check.bound, spec.shape, generator=gen, dtype=spec.dtype))
            else:  # positions from 0
                inputs.append(torch.arange(math.prod(spec.shape), dtype=spec.dtype).reshape(spec.shape))
        return inputs
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(given))
    except (SafetensorError, OSError) as exc:
        raise CommandError(f"{given}: cannot read inputs ({exc})") from None
    missing = [n for n in program.inputs if n not in tensors]
    if missing:
        raise CommandError(f"{given}: no tensor named {missing[0]!r}; the program's inputs are "
                           f"{', '.join(program.inputs)}")
    return [tensors[n] for n in program.inputs]


def run(path: Path, given: Path | None, repeat: int, seed: int) -> int:
    """Runs a program, compares it with its CPU run and times it; returns the exit status."""
    loaded = load(path, progress=progress)
    inputs = program_inputs(loaded.program, given, seed)

    def call():  # each call from the program's start state (a decoder: a fresh KV cache)
        loaded.reset()
        return loaded(*inputs)
    got = call()
    want = loaded.program.run_reference(*inputs)
    pairs = list(zip(got, want, strict=True)) if isinstance(got, tuple) else [(got, want)]
    equal = sum(int((a == b).sum()) for a, b in pairs)
    total = sum(b.numel() for _, b in pairs)
    walls = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        walls.append(time.perf_counter() - start)
    loaded.reset()
    rows = loaded.profile(*inputs)
    gpu = sum(r["seconds"] or 0 for r in rows if r["runs_on"] == "vulkan")
    cpu = sum(r["seconds"] for r in rows if r["runs_on"] == "cpu")
    tolerant = sorted({n.target for n in loaded.program.nodes} & TOLERANT_OPS)
    agrees = equal == total or (tolerant and min(_sqnr_db(a, b) for a, b in pairs) >= MIN_SQNR_DB)
    verdict = "bit-exact" if equal == total else f"{total - equal} of {total} values differ"
    if equal != total and tolerant:
        verdict += (f" (SQNR {min(_sqnr_db(a, b) for a, b in pairs):.1f} dB; {', '.join(tolerant)} are "
                    f"within stated tolerances, not bit-exact: at least {MIN_SQNR_DB} dB expected)")
    print(f"{path} on {loaded.device.caps.name}: output {verdict} against PyTorch on the CPU "
          "(its ops and the etvk reference kernels)")
    print(f"per call: {statistics.median(walls) * 1e3:.2f} ms wall (median of {repeat}), "
          f"{gpu * 1e3:.2f} ms on the device (timestamps), {cpu * 1e3:.2f} ms in CPU nodes")
    convs = [r["tuning"] for r in rows if r["tuning"]]
    if convs:
        measured = sum(t.startswith("measured") for t in convs)
        print(f"convs on the device: {measured} of {len(convs)} with measured choices "
              "(python -m runtime tune), the others by the rule")
    return 0 if agrees and _validation_clean(loaded.device) else 1


# Ops whose results are within a stated tolerance of their references (docs/llm_ops.md,
# docs/attention_ops.md), not bit-exact: a program holding them is held to MIN_SQNR_DB.
TOLERANT_OPS = frozenset({"etvk.rms_norm.default", "etvk.act_mul.default", "etvk.rms_norm_quantize.default",
                          "etvk.add_rms_norm_quantize.default", "etvk.act_mul_quantize.default",
                          "etvk.cache_attention.default"})
MIN_SQNR_DB = 60.0


def _sqnr_db(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal to quantization noise of `ours` against `reference`, in dB (inf when equal)."""
    noise = float((ours.double() - reference.double()).pow(2).sum())
    return math.inf if noise == 0 else 10 * math.log10(float(reference.double().pow(2).sum()) / noise)


def _validation_clean(device) -> bool:
    """With ETVK_VALIDATION=1: prints the validation layer's errors (the first few) and their count."""
    if not device.validation:
        return True
    errors = device.take_validation_messages("error")
    for text in errors[:5]:
        print(f"validation error: {text}")
    print(f"validation layer: {len(errors)} error(s)")
    return not errors
