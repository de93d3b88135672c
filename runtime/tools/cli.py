"""`python -m runtime <command>` (console script `etvk`).

Commands: ``info`` (the default: the device and which variants run on it),
``demo`` (every variant against its reference, then a small CNN exported,
saved, loaded and run), ``export``, ``inspect`` and ``run`` (programs; see
runtime.tools.program_commands), ``export-llm`` and ``generate`` (decoder
LLMs; runtime.tools.llm_commands), ``tune`` (measured conv choices for this
device; runtime.tools.tune_command) and ``stats`` (the driver compiler's
statistics of variants; runtime.tools.statistics_command). A user mistake or
a missing Vulkan device prints one line to stderr and exits 1, never a
traceback. This module parses arguments and calls the tool modules.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.errors import EtvkError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runtime", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("info", help="the device, its capabilities and which variants run on it (default)")
    sub.add_parser("demo", help="every variant against its reference, then a small CNN end to end")
    export = sub.add_parser("export", help="quantize a torchvision model (random weights) and save it")
    export.add_argument("name", help="a torchvision architecture, e.g. resnet18, resnet50, mobilenet_v2")
    export.add_argument("--out", type=Path, required=True, help="the program file to write")
    export.add_argument("--size", type=int, default=224, help="input height and width (default 224)")
    export.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    export.add_argument("--calibration", type=int, default=4, help="calibration batches (default 4)")
    export.add_argument("--seed", type=int, default=0)
    inspect = sub.add_parser("inspect", help="every node: where it runs and why; layouts; memory plan")
    inspect.add_argument("file", type=Path)
    run = sub.add_parser("run", help="run a program: agreement with PyTorch on the CPU, and timing")
    run.add_argument("file", type=Path)
    run.add_argument("--inputs", type=Path, help="a safetensors file with one tensor per program input "
                                                 "(by input name); default: random")
    run.add_argument("--repeat", type=int, default=10, help="timed calls (default 10)")
    run.add_argument("--seed", type=int, default=0)
    llm = sub.add_parser("export-llm", help="a decoder LLM (transformers) quantized 8da4w with a static "
                                            "KV cache, lowered and saved")
    llm.add_argument("source", help="a preset (llama-3.2-1b, tiny-llama: random weights), a config.json, "
                                    "or a folder with config.json and safetensors weights")
    llm.add_argument("--out", type=Path, required=True, help="the program file to write")
    llm.add_argument("--max-cache-len", type=int, default=256, help="KV cache positions (default 256)")
    llm.add_argument("--group-size", type=int, default=32, help="4-bit weight group size (default 32)")
    llm.add_argument("--max-prefill", type=int, default=128,
                     help="the most tokens one graph takes: prompts run in chunks of 1, 2, 4, ... up to "
                          "this (default 128, at most the cache; 1: a decode-only program, one token a call)")
    llm.add_argument("--layers", type=int, help="keep only this many layers (a smaller model)")
    llm.add_argument("--seed", type=int, default=0, help="seed of random weights")
    gen = sub.add_parser("generate", help="greedy generation with a decoder program: tokens and speed")
    gen.add_argument("file", type=Path)
    gen.add_argument("--prompt", required=True, help="prompt token ids, e.g. 1,2,3")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--eos", type=int, help="a token id that ends generation")
    tune = sub.add_parser("tune", help="time each conv's algorithms, layouts and tilings on this "
                                       "device; later loads use the fastest")
    tune.add_argument("file", type=Path)
    tune.add_argument("--batch", type=int, help="tune for this batch size instead of the program's")
    tune.add_argument("--repeat", type=int, default=3,
                      help="timed replays per candidate, after its warm-up (default 3)")
    tune.add_argument("--no-program-check", action="store_true",
                      help="keep the measured choices without timing the whole program against the rules")
    stats = sub.add_parser("stats", help="the driver compiler's statistics of shader variants "
                                         "(registers, shared memory: what decides occupancy)")
    stats.add_argument("variant", nargs="+", help="variant names, as `info` lists them")
    stats.add_argument("--spec", action="append", default=[], metavar="NAME=VALUE",
                       help="a spec constant for the variants that have it (repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`etvk`, `python -m runtime ...`); returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from runtime.tools.demo import run_demo

            return run_demo()
        if args.command in ("export", "inspect", "run"):
            from runtime.tools import program_commands as commands

            if args.command == "export":
                return commands.export(args.name, args.out, args.size, args.batch, args.calibration,
                                       args.seed)
            if args.command == "inspect":
                return commands.inspect(args.file)
            return commands.run(args.file, args.inputs, args.repeat, args.seed)
        if args.command in ("export-llm", "generate"):
            from runtime.tools import llm_commands

            if args.command == "generate":
                return llm_commands.generate(args.file, args.prompt, args.max_new_tokens, args.eos)
            return llm_commands.export_llm(args.source, args.out, args.max_cache_len, args.group_size,
                                           args.layers, args.seed, args.max_prefill)
        if args.command == "tune":
            from runtime.tools.tune_command import tune

            return tune(args.file, args.batch, args.repeat, program_check=not args.no_program_check)
        if args.command == "stats":
            from runtime.tools.statistics_command import statistics

            return statistics(args.variant, args.spec)
        from runtime.tools.info import info

        return info()
    except EtvkError as exc:
        print(exc, file=sys.stderr)
        return 1
