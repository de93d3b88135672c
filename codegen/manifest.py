"""Build generated/manifest.json (internals.md §3) from the resolved ops and variants.

Keys are sorted and the text ends with a newline, so the file is
deterministic. Must not render templates or touch files. Called by `build.py`.
"""

from __future__ import annotations

import json

from codegen.glslc import SPIRV_FLAGS
from codegen.interface import interface_dict
from codegen.naming import GENERATOR, MANIFEST_FORMAT, glsl_path, module_path


def build_manifest(ops, variants, interfaces, keys, shader_ops) -> str:
    """The manifest text.

    Args:
        ops: the ResolvedOps.
        variants: every Variant, in output order.
        interfaces: variant name -> Interface.
        keys: variant name -> SPIR-V cache key.
        shader_ops: variant name -> sorted registry keys of the ops it serves.
    """
    data = {
        "format": MANIFEST_FORMAT,
        "generator": GENERATOR,
        "spirv_flags": list(SPIRV_FLAGS),
        "ops": {
            op.key: {
                "family": op.spec.family,
                "schema": op.spec.schema.text,
                "doc": op.spec.doc,
                "reference": op.spec.reference,
                "module": module_path(op.spec.family),
                "spec": op.spec.loc.short(),
                "variants": [v.name for v in op.variants],
            }
            for op in ops
        },
        "shaders": {},
        "variants": {},
    }
    for v in variants:
        s = v.shader
        data["shaders"][s.name] = {
            "family": s.family,
            "template": s.template,
            "spec": s.loc.short(),
            "axes": [[a.name, list(a.values)] for a in s.axes],
        }
        data["variants"][v.name] = {
            "shader": s.name,
            "ops": shader_ops.get(v.name, []),
            "axes": dict(v.axes),
            "glsl": glsl_path(v.name),
            "spirv": keys[v.name],
            "requires": list(interfaces[v.name].requires),
            "spec": s.loc.short(),
            "interface": interface_dict(interfaces[v.name]),
        }
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
