"""The op library: generated folders (`library`), the op registry (`registry`), what the
generated stubs call (`stub_support`) and prepacked constants (`prepack`)."""
