"""PyTorch reference implementations: the definition of every op's numerics.

Each function takes exactly the arguments of its op's schema and computes
what OPS.md specifies, on the CPU, in the same fp32 order as the shaders.
They are the CPU kernels of ``torch.ops.etvk.*`` and the tests' oracle.
Nothing here touches Vulkan.
"""
