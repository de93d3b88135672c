"""The ABI of one variant, assigned once: bindings, push-constant layout, spec-constant ids.

`build_interface(variant)` filters the shader's bindings and push constants by
`when`, substitutes `${AXIS}`, numbers bindings in listing order, lays push
constants out std430 (scalars 4 bytes, 4-vectors 16-byte aligned), gives user
spec constants ids from 3. The same `Interface` renders the GLSL header
(`glsl_header`) and the manifest entry (`interface_dict`), so the two cannot
disagree. Spec-constant values and capabilities were checked once per shader
by `variants.check_shader`. Pure; must not read templates or files. Called by
`build.py`.
"""

from __future__ import annotations

from codegen import glsl
from codegen.errors import SpecError
from codegen.model import BindingSlot, Interface, PushField, SpecConstantSlot, Variant
from codegen.naming import GENERATOR
from codegen.spec import DTYPES, IMAGE_STORAGES, STORAGES
from codegen.variants import matches

FIRST_SPEC_ID = 3


def _substitute(text: str, axes: dict[str, str]) -> str:
    for axis, value in axes.items():
        text = text.replace("${" + axis + "}", value)
    return text


def build_interface(variant: Variant) -> tuple[Interface | None, list[SpecError]]:
    """Assigns the interface of a variant; returns (interface or None, errors)."""
    shader = variant.shader
    errors: list[SpecError] = []
    slots: list[BindingSlot] = []
    seen: set[str] = set()
    for b in shader.bindings:
        if not matches(b.when, variant.axes):
            continue
        dtype = _substitute(b.dtype, variant.axes)
        storage = _substitute(b.storage, variant.axes)
        where = f"binding '{b.name}' of variant {variant.name}"
        if dtype not in DTYPES:
            errors.append(
                SpecError(b.loc, f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
            )
            continue
        if storage not in STORAGES:
            errors.append(
                SpecError(
                    b.loc, f"{where}: storage {storage!r} is not one of {', '.join(STORAGES)}"
                )
            )
            continue
        if b.vec == 1 and (glsl.BITS[dtype] != 32 or storage != "buffer"):
            errors.append(
                SpecError(
                    b.loc,
                    f"{where}: vec: 1 needs a 32-bit dtype in a buffer, got {dtype} in {storage}; "
                    "use vec: 4",
                )
            )
            continue
        if b.wide and (dtype not in ("int8", "uint8") or storage != "buffer"):
            errors.append(
                SpecError(
                    b.loc,
                    f"{where}: wide needs an int8 or uint8 buffer, got {dtype} in {storage}; "
                    "split the binding with `when` so that only its buffer variants are wide",
                )
            )
            continue
        if b.name in seen:
            errors.append(
                SpecError(
                    b.loc,
                    f"{where}: two bindings named '{b.name}' in one variant; "
                    "make their `when` exclusive",
                )
            )
            continue
        seen.add(b.name)
        image = storage in IMAGE_STORAGES
        slots.append(
            BindingSlot(
                b.name,
                len(slots),
                dtype,
                storage,
                b.vec,
                b.access,
                "storage_image" if image else "storage_buffer",
                glsl.image_format(dtype) if image else None,
                b.wide,
            )
        )
    fields: list[PushField] = []
    offset = 0
    align_max = 4
    for p in shader.push_constants:
        if not matches(p.when, variant.axes):
            continue
        if any(f.name == p.name for f in fields):
            errors.append(
                SpecError(
                    p.loc,
                    f"push constant '{p.name}' of variant {variant.name}: two push constants "
                    f"named '{p.name}' in one variant; make their `when` exclusive",
                )
            )
            continue
        size = glsl.PUSH_TYPE_SIZES[p.type]
        offset = -(-offset // size) * size
        align_max = max(align_max, size)
        fields.append(PushField(p.name, p.type, offset, size))
        offset += size
    push_size = -(-offset // align_max) * align_max if fields else 0
    specs = tuple(
        SpecConstantSlot(s.name, FIRST_SPEC_ID + i, s.type, variant.spec_defaults[s.name])
        for i, s in enumerate(shader.spec_constants)
    )
    if errors:
        return None, errors
    return Interface(
        variant.workgroup,
        tuple(slots),
        tuple(fields),
        push_size,
        specs,
        variant.extensions,
        variant.requires,
    ), []


def glsl_header(interface: Interface, template: str, spec: str) -> str:
    """Everything before the rendered template body (internals.md §2)."""
    wg = interface.workgroup
    out = [
        f"// @generated by `{GENERATOR}` from {template} for {spec}; do not edit.",
        "#version 450",
        *(f"#extension {e} : require" for e in interface.extensions),
        "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2, "
        f"local_size_x = {wg[0]}, local_size_y = {wg[1]}, local_size_z = {wg[2]}) in;",
    ]
    for s in interface.spec_constants:
        out.append(
            f"layout(constant_id = {s.id}) const {s.type} {s.name} = {glsl.literal(s.type, s.default)};"
        )
    if interface.push_fields:
        out.append("layout(push_constant) uniform PushConstants {")
        out += [f"  layout(offset = {f.offset}) {f.type} {f.name};" for f in interface.push_fields]
        out.append("} pc;")
    text = "\n".join(out) + "\n" + glsl.HELPERS_GLSL  # before the accessors, which use them
    for b in interface.bindings:
        if b.storage in IMAGE_STORAGES:
            dims = 2 if b.storage == "texture2d" else 3
            text += glsl.image_binding(b.name, b.binding, b.dtype, b.access, dims)
        else:
            text += glsl.buffer_binding(b.name, b.binding, b.dtype, b.vec, b.access, b.wide)
    return text


def interface_dict(interface: Interface) -> dict:
    """The manifest's `interface` entry of a variant."""
    bindings = []
    for b in interface.bindings:
        entry = {
            "name": b.name,
            "binding": b.binding,
            "storage": b.storage,
            "dtype": b.dtype,
            "vec": b.vec,
            "access": b.access,
            "descriptor": b.descriptor,
        }
        if b.format:
            entry["format"] = b.format
        bindings.append(entry)
    return {
        "workgroup": list(interface.workgroup),
        "bindings": bindings,
        "push_constants": {
            "size": interface.push_size,
            "fields": [
                {"name": f.name, "type": f.type, "offset": f.offset} for f in interface.push_fields
            ],
        },
        "spec_constants": [
            {"name": s.name, "id": s.id, "type": s.type, "default": s.default}
            for s in interface.spec_constants
        ],
    }
