"""The op library: generated folders (`library`), the op registry (`registry`), what the
generated stubs call (`stub_support`), prepacked constants (`prepack`) and the devices'
cooperative-matrix layouts that variant choices depend on (`matrix_layouts`)."""
