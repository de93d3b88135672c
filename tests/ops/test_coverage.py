"""Every built-in op has example arguments, so every generated variant runs.

`test_quantize.py` (and the tests of later families) dispatch each variant of
each op in `runtime.tools.examples.EXAMPLES`; an op missing from that table would
leave its variants untested, so this fails until it is added. Ops of one's own
(loaded from other folders, as tests/examples does) bring their own tests. The
one variant that is no op's, the runtime's cooperative-matrix layout probe, is
run by tests/runtime/ops/test_matrix_layouts.py.
"""

from runtime.ops.library import ShaderLibrary, builtin_dir
from runtime.ops.matrix_layouts import PROBE
from runtime.ops.registry import get_op
from runtime.tools.examples import EXAMPLES

BUILTIN = ShaderLibrary(builtin_dir())


def test_every_op_has_examples():
    missing = sorted(set(BUILTIN.ops()) - set(EXAMPLES))
    assert not missing, f"add example arguments to runtime/tools/examples.py for: {', '.join(missing)}"


def test_every_manifest_variant_belongs_to_a_registered_op():
    served = {name for op in BUILTIN.ops() for name, _ in get_op(op).opdef.variants}
    orphans = sorted({v.name for v in BUILTIN.variants()} - served - {PROBE})
    assert not orphans, f"variants no op can dispatch: {', '.join(orphans)}"
