"""Public alias of `runtime.vulkan.stream` (``from runtime.command import Stream``).

The README and users record several ops into one stream through this path;
the implementation lives in the Vulkan layer. Nothing else belongs here.
"""

from runtime.vulkan.stream import Stream

__all__ = ["Stream"]
