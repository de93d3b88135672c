"""Whole programs: lowering ``torch.export`` models (`lower`), the saved file (`fileformat`),
loading on a device (`loader`: placement, layouts, memory plan, recording) and calling them.

Modules: `nodes` (records), `program` (`Program`), `from_export` (op-for-op
conversion), `rewrite` (what patterns share), `lower` (the conv and the quantize edges),
`lower_cnn` (the other int8 CNN patterns), `cpu` (nodes on the CPU, the ops a program
may name), `fileformat`, `memory_plan`, `recording`, `loader`.
"""
