"""Tools: ``python -m runtime`` (`cli`), the demo (`demo`) and the example arguments the
tests, the demo and the benchmarks share (`examples`, `examples_conv2d`)."""
