"""Host-side rules of each op family, plain torch and Python (no Vulkan):
conv2d geometry, device rules and weight packing (`conv2d`), the GEMM tiling
(`conv2d_tiling`), 4-bit packing (`int4`), linear weight prepacking
(`linear_weights`) and the few-token linear kernel's tiling (`linear_tiling`)."""
