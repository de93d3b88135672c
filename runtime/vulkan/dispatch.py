"""Dispatch arguments to Vulkan numbers: group counts, x-into-y folding, push-constant bytes.

Pure functions of a variant's manifest interface and the device limits; what
depends only on the variant (names, the push-constant struct, binding dtypes) is worked out
once per (variant name, SPIR-V key). It must not call Vulkan. Called by
stream.py.
"""

from __future__ import annotations

import struct

from runtime.errors import DispatchError
from runtime.vulkan.interface import IMAGE_STORAGES
from runtime.vulkan.tensor import dtype_info

PUSH_FORMATS = {"uint": "I", "int": "i", "float": "f", "uvec4": "4I", "ivec4": "4i", "vec4": "4f"}


def group_counts(workgroup, global_size=None, groups=None) -> tuple[list[int], list[int]]:
    """Group counts and global size (each 3 long) from exactly one of `global_size` / `groups`.

    Raises:
        DispatchError: neither or both given, or more than 3 dimensions.
    """
    if (global_size is None) == (groups is None):
        raise DispatchError("dispatch needs exactly one of global_size= and groups=")
    size = [int(v) for v in (global_size if groups is None else groups)]
    if not 1 <= len(size) <= 3:
        raise DispatchError(f"dispatch size must have 1 to 3 dimensions, got {size}")
    size += [1] * (3 - len(size))
    if groups is not None:
        return size, [g * w for g, w in zip(size, workgroup, strict=True)]
    return [-(-g // w) for g, w in zip(size, workgroup, strict=True)], size


def fold_groups(counts: list[int], limits) -> list[int]:
    """Fold an x count over `limits[0]` into x*y when y == z == 1.

    Raises:
        DispatchError: a count is still over its limit.
    """
    x, y, z = counts
    if x > limits[0] and y == z == 1:
        x, y = limits[0], -(-x // limits[0])
    if x > limits[0] or y > limits[1] or z > limits[2]:
        raise DispatchError(f"group counts {list(counts)} exceed the device limit {list(limits)}")
    return [x, y, z]


class Layout:
    """What `dispatch` checks and packs for one variant, worked out once per (name, SPIR-V key)."""

    def __init__(self, variant):
        interface = variant.interface
        self.binding_names = frozenset(b.name for b in interface.bindings)
        # (binding, is an image, torch dtype) in binding order, for the descriptor writes
        self.bindings = tuple((b, b.storage in IMAGE_STORAGES, dtype_info(b.dtype).torch_dtype)
                              for b in interface.bindings)
        self.push_names = frozenset(f.name for f in interface.push_constants)
        self.push_order = [(f.name, f.type.endswith("vec4"))
                           for f in sorted(interface.push_constants, key=lambda f: f.offset)]
        fmt, end = "<", 0
        for field in sorted(interface.push_constants, key=lambda f: f.offset):
            if field.offset < end:  # overlapping fields: pack field by field
                fmt = None
                break
            fmt += f"{field.offset - end}x{PUSH_FORMATS[field.type]}"
            end = field.offset + struct.calcsize("<" + PUSH_FORMATS[field.type])
        self.push_struct = None
        if fmt is not None and end <= interface.push_constants_size:
            self.push_struct = struct.Struct(f"{fmt}{interface.push_constants_size - end}x")


_LAYOUTS: dict[tuple, Layout] = {}


def layout(variant) -> Layout:
    """The `Layout` of `variant` (a `VariantInfo`), made on first use."""
    key = (variant.name, variant.spirv_key)
    found = _LAYOUTS.get(key)
    if found is None:
        found = _LAYOUTS[key] = Layout(variant)
    return found


def pack_push(variant, op: str, push: dict) -> bytes:
    """Pack `push` (field name -> value) by the manifest's field offsets and types.

    Raises:
        DispatchError: missing or unknown field names, or a value that does not fit its type.
    """
    fields = layout(variant)
    if push.keys() != fields.push_names:
        check_names(op, variant, "push constants", fields.push_names, push)
    if fields.push_struct is not None:
        values = []
        for name, vec in fields.push_order:
            value = tuple(push[name]) if vec else (push[name],)
            if len(value) != (4 if vec else 1):
                break
            values += value
        else:
            try:
                return fields.push_struct.pack(*values)
            except struct.error:
                pass  # field by field, to name the field that does not fit
    data = bytearray(variant.interface.push_constants_size)
    for field in variant.interface.push_constants:
        value = push[field.name]
        values = list(value) if field.type.endswith("vec4") else [value]
        try:
            struct.pack_into("<" + PUSH_FORMATS[field.type], data, field.offset, *values)
        except struct.error as exc:
            raise DispatchError(f"{op}: variant {variant.name}: push constant '{field.name}' "
                                f"({field.type}) cannot hold {value!r}: {exc}") from None
    return bytes(data)


def check_names(op: str, variant, what: str, expected: set, given: dict) -> None:
    """Raise `DispatchError` naming what is missing from / unexpected in `given`, if anything."""
    missing, extra = sorted(expected - set(given)), sorted(set(given) - expected)
    if missing or extra:
        raise DispatchError(f"{op}: variant {variant.name}: {what} missing {missing}, "
                            f"unexpected {extra}; expected {sorted(expected)}")
