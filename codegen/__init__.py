"""etvk codegen: YAML op specs and Jinja templates -> GLSL variants, dispatch stubs, a manifest, SPIR-V.

``python -m codegen generate | compile | check | list | docs``; the stages and
their modules are listed in the design (ARCHITECTURE.md) and docs/internals.md.
It never imports the runtime: the two meet only at the generated folder.
"""
