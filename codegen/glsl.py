"""GLSL vocabulary: dtype -> unit types, image formats, accessor code, helper functions.

Pure tables and string builders for the generated header (internals.md §2).
Must not decide binding numbers or offsets (that is `interface.py`, which
calls these builders) and must not read files. Also provides the Jinja filters
`vec4_type` and `scalar_type` used by templates (through `render.py`).
"""

from __future__ import annotations

# dtype -> (buffer unit type for vec 4, value vector type, image format, image type)
DTYPE_TABLE = {
    "float32": ("vec4", "vec4", "rgba32f", "image3D"),
    "float16": ("uvec2", "vec4", "rgba16f", "image3D"),
    "int32": ("ivec4", "ivec4", "rgba32i", "iimage3D"),
    "int8": ("uint", "ivec4", "rgba8i", "iimage3D"),
    "uint8": ("uint", "ivec4", "rgba8ui", "uimage3D"),
}
SCALAR_TYPES = {"float32": "float", "int32": "int"}  # vec: 1 (32-bit dtypes only)
BITS = {"float32": 32, "float16": 16, "int32": 32, "int8": 8, "uint8": 8}
PUSH_TYPE_SIZES = {"int": 4, "uint": 4, "float": 4, "ivec4": 16, "uvec4": 16, "vec4": 16}
ACCESS_QUALIFIERS = {"read": "readonly ", "write": "writeonly ", "read_write": ""}

HELPERS_GLSL = """\
uint etvk_linear_invocation() {
  return gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x;
}
uint etvk_linear_group() {
  return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
}
// The exact fp32 value of the half with bits h, built from integer operations
// so that no compiler can fold it into a float conversion.
float etvk_half_value(uint h) {
  const uint sign = (h & 0x8000u) << 16u;
  const uint exponent = (h >> 10u) & 0x1Fu;
  const uint mantissa = h & 0x3FFu;
  if (exponent == 0u) {
    const float magnitude = float(mantissa) * 5.9604644775390625e-8;
    return sign != 0u ? -magnitude : magnitude;
  }
  const uint biased = exponent == 31u ? 255u : exponent + 112u;
  return uintBitsToFloat(sign | (biased << 23u) | (mantissa << 13u));
}
// v rounded to the nearest fp16 values (ties to even), as fp32. Storage-image
// writes may convert by truncation (NVIDIA does, and folds an
// unpackHalf2x16(packHalf2x16(v)) round trip away), so fp16 texels are stored
// from values that convert exactly.
vec4 etvk_round_to_half(vec4 v) {
  const uvec2 h = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
  return vec4(etvk_half_value(h.x & 0xFFFFu), etvk_half_value(h.x >> 16u),
              etvk_half_value(h.y & 0xFFFFu), etvk_half_value(h.y >> 16u));
}
"""


def vec4_type(dtype: str) -> str:
    """The 4-value type accessors use: `vec4` for float dtypes, `ivec4` for integer ones."""
    return DTYPE_TABLE[dtype][1]


def scalar_type(dtype: str) -> str:
    """The scalar type of a `vec: 1` binding: `float` or `int`."""
    return SCALAR_TYPES[dtype]


def image_format(dtype: str) -> str:
    """The storage-image format of a texture3d tensor of `dtype`."""
    return DTYPE_TABLE[dtype][2]


def literal(type_: str, value) -> str:
    """A GLSL literal of a spec-constant type."""
    if type_ == "bool":
        return "true" if value else "false"
    if type_ == "float":
        text = repr(float(value))
        return text if ("." in text or "e" in text) else text + ".0"
    if type_ == "uint":
        return f"{int(value)}u"
    return str(int(value))


def buffer_binding(name: str, binding: int, dtype: str, vec: int, access: str,
                   wide: bool = False) -> str:
    """Declaration and accessors of a storage buffer; `wide` (int8/uint8) adds a second,
    16-byte view of the same binding for NAME_load_word4 (read) and NAME_store_word4 (written)."""
    unit = scalar_type(dtype) if vec == 1 else DTYPE_TABLE[dtype][0]
    qual = ACCESS_QUALIFIERS[access]
    lines = [
        f"layout(set = 0, binding = {binding}, std430) {qual}buffer {name}_block {{",
        f"  {unit} data[];",
        f"}} {name};",
    ]
    reads = access in ("read", "read_write")
    writes = access in ("write", "read_write")
    if vec == 1:
        if reads:
            lines.append(f"{unit} {name}_load(uint i) {{ return {name}.data[i]; }}")
        if writes:
            lines.append(f"void {name}_store(uint i, {unit} v) {{ {name}.data[i] = v; }}")
        return "\n".join(lines) + "\n"
    v4 = vec4_type(dtype)
    load, store = _UNIT_CODE[dtype]
    if reads:
        lines.append(f"{v4} {name}_load(uint unit) {{")
        lines += [f"  {s}" for s in load.format(src=f"{name}.data[unit]").splitlines()]
        lines.append("}")
    if writes:
        lines.append(f"void {name}_store(uint unit, {v4} v) {{")
        lines += [f"  {s}" for s in store.format(dst=f"{name}.data[unit]").splitlines()]
        lines.append("}")
    if dtype in ("int8", "uint8"):  # the raw 32-bit word of 4 bytes, for packed int8 math
        if reads:
            lines.append(f"uint {name}_load_word(uint unit) {{ return {name}.data[unit]; }}")
        if writes:
            lines.append(f"void {name}_store_word(uint unit, uint w) {{ {name}.data[unit] = w; }}")
    if wide:  # words 4i .. 4i+3 in one access: the same binding, aliased as 16-byte units
        lines += [
            f"layout(set = 0, binding = {binding}, std430) {qual}buffer {name}_wide_block {{",
            "  uvec4 data[];",
            f"}} {name}_wide;",
        ]
        if reads:
            lines.append(f"uvec4 {name}_load_word4(uint i) {{ return {name}_wide.data[i]; }}")
        if writes:
            lines.append(f"void {name}_store_word4(uint i, uvec4 w) {{ {name}_wide.data[i] = w; }}")
    return "\n".join(lines) + "\n"


_UNIT_CODE = {
    "float32": ("return {src};", "{dst} = v;"),
    "int32": ("return {src};", "{dst} = v;"),
    "float16": (
        "const uvec2 u = {src};\nreturn vec4(unpackHalf2x16(u.x), unpackHalf2x16(u.y));",
        "{dst} = uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));",
    ),
    "int8": (
        "const int u = int({src});\n"
        "return ivec4(bitfieldExtract(u, 0, 8), bitfieldExtract(u, 8, 8), "
        "bitfieldExtract(u, 16, 8), bitfieldExtract(u, 24, 8));",
        "const uvec4 b = uvec4(v) & 0xFFu;\n{dst} = b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);",
    ),
    "uint8": (
        "const uint u = {src};\n"
        "return ivec4(uvec4(bitfieldExtract(u, 0, 8), bitfieldExtract(u, 8, 8), "
        "bitfieldExtract(u, 16, 8), bitfieldExtract(u, 24, 8)));",
        "const uvec4 b = uvec4(v) & 0xFFu;\n{dst} = b.x | (b.y << 8) | (b.z << 16) | (b.w << 24);",
    ),
}


def image_binding(name: str, binding: int, dtype: str, access: str, dims: int = 3) -> str:
    """Declaration and accessors of a storage image: 3-D (texture3d) or 2-D (texture2d)."""
    _, v4, fmt, image = DTYPE_TABLE[dtype]
    image = image.replace("3D", f"{dims}D")
    coord = f"ivec{dims}"
    qual = ACCESS_QUALIFIERS[access]
    lines = [
        f"layout(set = 0, binding = {binding}, {fmt}) uniform {qual}{image} {name};",
        f"{coord} {name}_extents() {{ return imageSize({name}); }}",
    ]
    if access in ("read", "read_write"):
        value = f"imageLoad({name}, texel)"
        if dtype == "uint8":
            value = f"ivec4({value})"
        lines.append(f"{v4} {name}_load({coord} texel) {{ return {value}; }}")
    if access in ("write", "read_write"):
        value = "v"
        if dtype == "float16":
            value = "etvk_round_to_half(v)"
        elif dtype == "uint8":
            value = "uvec4(v)"
        lines.append(
            f"void {name}_store({coord} texel, {v4} v) {{ imageStore({name}, texel, {value}); }}"
        )
    return "\n".join(lines) + "\n"
