"""Every registered op has example arguments, so every generated variant runs.

`test_quantize.py` (and the tests of later families) dispatch each variant of
each op in `runtime.examples.EXAMPLES`; an op missing from that table would
leave its variants untested, so this fails until it is added.
"""

import runtime
from runtime.examples import EXAMPLES
from runtime.shaders import get_library


def test_every_op_has_examples():
    missing = sorted(set(runtime.list_ops()) - set(EXAMPLES))
    assert not missing, f"add example arguments to runtime/examples.py for: {', '.join(missing)}"


def test_every_manifest_variant_belongs_to_a_registered_op():
    served = {name for op in runtime.list_ops() for name, _ in runtime.get_op(op).opdef.variants}
    orphans = sorted({v.name for v in get_library().variants()} - served)
    assert not orphans, f"variants no op can dispatch: {', '.join(orphans)}"
