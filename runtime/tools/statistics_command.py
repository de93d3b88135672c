"""``python -m runtime stats VARIANT... [--spec NAME=VALUE]``: the driver compiler's statistics.

For each named variant (with the given spec constants; workgroup sizes are the
variant's own) prints what the driver reports through
VK_KHR_pipeline_executable_properties: on NVIDIA e.g. registers per
invocation and shared memory, the figures that decide how many workgroups an
SM holds (runtime/vulkan/statistics.py). A table on stdout: variant,
executable, statistic, value, the driver's description. Errors (an unknown
variant, a bad --spec, a device without the extension or without what a
variant requires) are raised as `CommandError`s for the CLI to print as one
line. Called by runtime.tools.cli.
"""

from __future__ import annotations

from runtime.errors import UnsupportedVariant
from runtime.ops.library import catalog
from runtime.tools.program_commands import CommandError, table
from runtime.vulkan.device import get_device
from runtime.vulkan.statistics import pipeline_statistics


def parse_specs(items: list[str]) -> dict:
    """``["STEPS=4", ...]`` -> ``{"STEPS": 4}`` (int, else float).

    Raises:
        CommandError: an item is not NAME=NUMBER.
    """
    specs = {}
    for item in items:
        name, equals, text = item.partition("=")
        try:
            if not (equals and name.strip()):
                raise ValueError
            value = float(text) if any(c in text for c in ".eE") else int(text, 0)
        except ValueError:
            raise CommandError(f"--spec {item!r}: expected NAME=NUMBER, e.g. STEPS=4") from None
        specs[name.strip()] = value
    return specs


def _value(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:g}" if isinstance(value, float) else str(value)


def statistics(names: list[str], spec_items: list[str]) -> int:
    """Prints the statistics of each variant in `names`; returns the exit status."""
    specs = parse_specs(spec_items)
    library = catalog()
    variants = []
    for name in names:
        try:
            variants.append(library.variant(name))
        except KeyError as exc:
            raise CommandError(exc.args[0]) from None
    unused = sorted(set(specs) - {s.name for v in variants for s in v.interface.spec_constants})
    if unused:
        raise CommandError(f"--spec {', '.join(unused)}: no named variant has such a spec constant")
    device = get_device()
    rows = [["variant", "executable", "statistic", "value", "description"]]
    for variant in variants:
        ok, why = variant.runnable(device.caps)
        if not ok:
            raise CommandError(f"{variant.name} cannot run here: {why}")
        known = {s.name for s in variant.interface.spec_constants}
        try:
            found = pipeline_statistics(device, variant, {k: v for k, v in specs.items() if k in known})
        except UnsupportedVariant as exc:
            raise CommandError(str(exc)) from None
        rows += [[variant.name, s.executable, s.name, _value(s.value), s.description] for s in found]
    print(table(rows) if len(rows) > 1 else "the driver reported no statistics")
    return 0
