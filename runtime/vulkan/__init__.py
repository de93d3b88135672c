"""The Vulkan layer: instance, device probe and choice, memory, tensors, kernels, pipelines, streams.

It runs compute kernels (`interface.Kernel`: SPIR-V plus its ABI) on device
tensors and knows nothing of ops, manifests or PyTorch programs. Modules:
`raw` (the binding's C entry points), `instance`, `probe`, `device`,
`recycler`, `memory`, `layouts` (packed int8 layouts), `tensor`,
`interface`, `pipeline`, `statistics` (the compiler's statistics of a
pipeline), `dispatch` (dispatch arithmetic), `stream`.
"""
