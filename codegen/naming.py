"""The one grammar for names: variant names, registry keys, stub identifiers, output paths.

Variant name = shader name + "_" + each axis value's short form in axis order
(`float32` -> `float`, `float16` -> `half`). `parse_variant_name` reverses it.
Everything that needs a name asks this module; nothing else glues names.
This module must not know about specs or files beyond relative output paths.
Called by variants, validate, stubs, manifest, glslc and render (as filters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SHORT_FORMS = {"float32": "float", "float16": "half"}
MANIFEST = "manifest.json"
# The generated-folder format (manifest + stub protocol); the runtime refuses other values
# (runtime/ops/library.py FORMAT, kept equal by a test).
MANIFEST_FORMAT = 2
GENERATOR = "python -m codegen generate"


def short_value(value: str) -> str:
    """The short form of an axis value in variant names."""
    return SHORT_FORMS.get(value, value)


def variant_name(shader: str, values: Sequence[str]) -> str:
    """`quantize_per_tensor_buffer_float_int8` from the shader name and axis values in order."""
    return "_".join([shader, *(short_value(v) for v in values)])


def parse_variant_name(name: str, shader_name: str, axes: Mapping[str, Sequence[str]]) -> dict:
    """Reverses `variant_name`: returns {axis: value} in axis order.

    Args:
        name: a variant name.
        shader_name: the shader it belongs to.
        axes: the shader's axes in order, each with its allowed values.

    Raises:
        ValueError: the name does not belong to the shader or no value assignment fits.
    """
    axis_items = list(axes.items())
    if not axis_items:
        if name == shader_name:
            return {}
        raise ValueError(f"{name!r} is not the variant of axis-less shader {shader_name!r}")
    prefix = shader_name + "_"
    if not name.startswith(prefix):
        raise ValueError(f"{name!r} does not start with {prefix!r}")

    def solve(rest: str, i: int) -> list[str] | None:
        axis, values = axis_items[i]
        last = i == len(axis_items) - 1
        for value in values:
            short = short_value(value)
            if last and rest == short:
                return [value]
            if not last and rest.startswith(short + "_"):
                tail = solve(rest[len(short) + 1 :], i + 1)
                if tail is not None:
                    return [value, *tail]
        return None

    found = solve(name[len(prefix) :], 0)
    if found is None:
        raise ValueError(f"{name!r} is not a variant name of shader {shader_name!r}")
    return {axis: value for (axis, _), value in zip(axis_items, found, strict=True)}


def registry_key(op: str) -> str:
    """`etvk.<op>.default`, the key of an op in the manifest and the registry."""
    return f"etvk.{op}.default"


def op_constant(op: str) -> str:
    """Name of the `OpDef` constant in the stub module."""
    return op.upper()


def check_function(check: str) -> str:
    """Name of the stub-module function of a family check: ``_check_<name>``."""
    return f"_check_{check}"


def fake_function(op: str) -> str:
    """Name of the fake (meta) function in the stub module."""
    return f"_{op}_fake"


def glsl_path(variant: str) -> str:
    """Path of a variant's GLSL relative to the output folder."""
    return f"glsl/{variant}.comp"


def module_path(family: str) -> str:
    """Path of a family's stub module relative to the output folder."""
    return f"ops/{family}.py"
