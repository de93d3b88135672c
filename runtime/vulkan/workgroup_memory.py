"""The shared (Workgroup storage class) memory of a specialized SPIR-V kernel.

Array lengths in our shaders depend on specialization constants (the
workgroup size, tiling constants), so the bytes a pipeline needs are only
known once it is specialized. `workgroup_memory_bytes` reads the module's
declarations (everything before the first function), evaluates the constants
that size its Workgroup variables, specialization included, and lays the
variables out as the Vulkan spec measures them against
`maxComputeSharedMemorySize` (VUID-RuntimeSpirv-Workgroup-06530): in
declaration order, each at the smallest offset its std430 alignment allows,
booleans counted as 32-bit integers. pipeline.py checks the result before it
builds a pipeline, so a setting over the limit is refused with the figures
instead of being handed to the driver (on NVIDIA, a lost device). Every
variant of the catalog must evaluate (tests/runtime/vulkan/test_workgroup_memory.py);
a module that uses what this reader does not know is left to the driver.

Pure: bytes in, an int out; no Vulkan, no files. Called by pipeline.py and
the tests.
"""

from __future__ import annotations

from array import array

from runtime.errors import EtvkError

WORKGROUP = 4  # the SPIR-V storage class

# Opcodes of the declarations read here.
_DECORATE, _SPEC_ID = 71, 1
_TYPE_BOOL, _TYPE_INT, _TYPE_FLOAT, _TYPE_VECTOR, _TYPE_MATRIX = 20, 21, 22, 23, 24
_TYPE_ARRAY, _TYPE_STRUCT, _TYPE_POINTER = 28, 30, 32
_TRUE, _FALSE, _CONSTANT, _COMPOSITE = 41, 42, 43, 44
_SPEC_TRUE, _SPEC_FALSE, _SPEC_CONSTANT, _SPEC_COMPOSITE, _SPEC_OP = 48, 49, 50, 51, 52
_VARIABLE, _FUNCTION = 59, 54

_BINARY = {
    128: lambda a, b: a + b,    # OpIAdd
    130: lambda a, b: a - b,    # OpISub
    132: lambda a, b: a * b,    # OpIMul
    134: lambda a, b: a // b,   # OpUDiv
    135: lambda a, b: _sdiv(a, b),          # OpSDiv (rounds toward 0)
    137: lambda a, b: a % b,    # OpUMod
    138: lambda a, b: a - b * _sdiv(a, b),  # OpSRem (the sign of a)
    139: lambda a, b: a % b,    # OpSMod (the sign of b, as Python's %)
    194: lambda a, b: a >> b,   # OpShiftRightLogical (a is read unsigned)
    195: lambda a, b: a >> b,   # OpShiftRightArithmetic (a is read signed)
    196: lambda a, b: a << b,   # OpShiftLeftLogical
    197: lambda a, b: a | b,    # OpBitwiseOr
    198: lambda a, b: a ^ b,    # OpBitwiseXor
    199: lambda a, b: a & b,    # OpBitwiseAnd
    164: lambda a, b: a == b,   # OpLogicalEqual
    165: lambda a, b: a != b,   # OpLogicalNotEqual
    166: lambda a, b: a or b,   # OpLogicalOr
    167: lambda a, b: a and b,  # OpLogicalAnd
    170: lambda a, b: a == b,   # OpIEqual
    171: lambda a, b: a != b,   # OpINotEqual
    172: lambda a, b: a > b,    # OpUGreaterThan
    173: lambda a, b: a > b,    # OpSGreaterThan
    174: lambda a, b: a >= b,   # OpUGreaterThanEqual
    175: lambda a, b: a >= b,   # OpSGreaterThanEqual
    176: lambda a, b: a < b,    # OpULessThan
    177: lambda a, b: a < b,    # OpSLessThan
    178: lambda a, b: a <= b,   # OpULessThanEqual
    179: lambda a, b: a <= b,   # OpSLessThanEqual
}
# Operands read as signed integers; the others as unsigned (the opcode, not the type, decides).
_SIGNED = {135, 138, 139, 173, 175, 177, 179, 195, 114, 126}
_UNARY = {126: lambda a: -a, 200: lambda a: ~a, 168: lambda a: not a,  # OpSNegate, OpNot, OpLogicalNot
          113: lambda a: a, 114: lambda a: a}                        # OpUConvert, OpSConvert
_SELECT, _EXTRACT = 169, 81


def _sdiv(a: int, b: int) -> int:
    quotient = abs(a) // abs(b)
    return quotient if (a < 0) == (b < 0) else -quotient


class SpirvError(EtvkError, ValueError):
    """The module is not SPIR-V, or a size depends on something this reader does not evaluate."""


def workgroup_memory_bytes(spirv: bytes, specs=()) -> int:
    """Bytes of the Workgroup variables of `spirv` specialized with `specs`.

    Args:
        spirv: a SPIR-V module.
        specs: (spec id, struct format, value) triples, as `pipeline.spec_values`
            gives them; constants not named keep the module's defaults.

    Raises:
        SpirvError: not a SPIR-V module, or an array length this reader cannot
            evaluate (an OpSpecConstantOp outside the integer and logic ops).
    """
    return _Module(spirv, {spec_id: value for spec_id, _, value in specs}).workgroup_bytes()


class _Module:
    """The declarations of one module and the constants evaluated from them (on demand)."""

    def __init__(self, spirv: bytes, overrides: dict):
        if len(spirv) % 4 or len(spirv) < 20:
            raise SpirvError(f"not a SPIR-V module: {len(spirv)} bytes")
        words = array("I", spirv)
        if words[0] == 0x03022307:
            words.byteswap()
        if words[0] != 0x07230203:
            raise SpirvError(f"not a SPIR-V module: magic {words[0]:#010x}")
        self.defs: dict[int, tuple[int, tuple]] = {}  # result id -> (opcode, operands after it)
        self.spec_ids: dict[int, int] = {}
        self.variables: list[int] = []  # pointer types of the Workgroup variables, in order
        self.overrides = overrides
        self.values: dict[int, object] = {}
        at = 5
        while True:
            if at == len(words):
                raise SpirvError("truncated SPIR-V: no function after the declarations")
            count, opcode = words[at] >> 16, words[at] & 0xFFFF
            if count == 0 or at + count > len(words):
                raise SpirvError(f"truncated SPIR-V instruction at word {at}")
            if opcode == _FUNCTION:
                break
            operands = tuple(words[at + 1:at + count])
            at += count
            if opcode == _DECORATE and operands[1] == _SPEC_ID:
                self.spec_ids[operands[0]] = operands[2]
            elif opcode == _VARIABLE:
                if operands[2] == WORKGROUP:
                    self.variables.append(operands[0])
            elif opcode in (_TYPE_BOOL, _TYPE_INT, _TYPE_FLOAT, _TYPE_VECTOR, _TYPE_MATRIX,
                            _TYPE_ARRAY, _TYPE_STRUCT, _TYPE_POINTER):
                self.defs[operands[0]] = (opcode, operands[1:])
            elif opcode in (_TRUE, _FALSE, _CONSTANT, _COMPOSITE, _SPEC_TRUE, _SPEC_FALSE,
                            _SPEC_CONSTANT, _SPEC_COMPOSITE, _SPEC_OP):
                self.defs[operands[1]] = (opcode, (operands[0],) + operands[2:])

    def workgroup_bytes(self) -> int:
        end = 0
        for pointer in self.variables:
            size, align = self.layout(self.defs[pointer][1][1])
            end = -(-end // align) * align + size
        return end

    def layout(self, type_id: int) -> tuple[int, int]:
        """(size, alignment) of a type under std430, booleans as 32-bit integers."""
        opcode, operands = self.defs[type_id]
        if opcode == _TYPE_BOOL:
            return 4, 4
        if opcode in (_TYPE_INT, _TYPE_FLOAT):
            return operands[0] // 8, operands[0] // 8
        if opcode == _TYPE_VECTOR:
            scalar, _ = self.layout(operands[0])
            return scalar * operands[1], scalar * (4 if operands[1] == 3 else operands[1])
        if opcode in (_TYPE_MATRIX, _TYPE_ARRAY):  # a matrix is an array of its columns
            size, align = self.layout(operands[0])
            length = operands[1] if opcode == _TYPE_MATRIX else self.value(operands[1])
            return length * -(-size // align) * align, align
        if opcode == _TYPE_STRUCT:
            end, align = 0, 1
            for member in operands:
                size, member_align = self.layout(member)
                end = -(-end // member_align) * member_align + size
                align = max(align, member_align)
            return -(-end // align) * align, align
        raise SpirvError(f"a Workgroup variable of SPIR-V type opcode {opcode}, which has no std430 size")

    def value(self, result_id: int):
        if result_id not in self.values:
            self.values[result_id] = self._evaluate(result_id)
        return self.values[result_id]

    def _evaluate(self, result_id: int):
        opcode, operands = self.defs[result_id]
        type_id = operands[0]
        spec_id = self.spec_ids.get(result_id)
        if opcode in (_TRUE, _FALSE, _SPEC_TRUE, _SPEC_FALSE):
            if spec_id in self.overrides:
                return bool(self.overrides[spec_id])
            return opcode in (_TRUE, _SPEC_TRUE)
        if opcode in (_CONSTANT, _SPEC_CONSTANT):
            if spec_id in self.overrides:
                return self._wrap(type_id, self.overrides[spec_id])
            words = operands[1:]
            return self._wrap(type_id, sum(w << (32 * i) for i, w in enumerate(words)))
        if opcode in (_COMPOSITE, _SPEC_COMPOSITE):
            return tuple(self.value(c) for c in operands[1:])
        inner, args = operands[1], operands[2:]
        if inner == _EXTRACT:
            value = self.value(args[0])
            for index in args[1:]:
                value = value[index]
            return value
        if inner == _SELECT:
            return self.value(args[1]) if self.value(args[0]) else self.value(args[2])
        signed = inner in _SIGNED
        values = [self._read(a, signed) for a in args]
        if inner in _UNARY and len(values) == 1:
            return self._wrap(type_id, _UNARY[inner](values[0]))
        if inner in _BINARY and len(values) == 2:
            return self._wrap(type_id, _BINARY[inner](*values))
        raise SpirvError(f"OpSpecConstantOp with opcode {inner} (result %{result_id}) is not evaluated")

    def _read(self, result_id: int, signed: bool):
        """A scalar constant as an integer (signed or not, as the opcode reads it) or a bool."""
        value = self.value(result_id)
        if isinstance(value, bool) or not signed:
            return value
        width = self.defs[self.defs[result_id][1][0]][1][0]
        return value - (1 << width) if value >> (width - 1) else value

    def _wrap(self, type_id: int, value):
        """`value` as the type stores it: a bool, an integer modulo 2^width (read unsigned), or a
        float's value as given (never a length)."""
        opcode, operands = self.defs[type_id]
        if opcode == _TYPE_BOOL:
            return bool(value)
        if opcode == _TYPE_INT:
            return int(value) & ((1 << operands[0]) - 1)
        return value
