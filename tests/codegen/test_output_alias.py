"""An output written in place (`alias`): the stub uploads the argument into the output's
binding and returns that device tensor; the OpDef records which output is which argument.
The golden cases output_alias*.yaml hold the errors."""

from __future__ import annotations

from codegen_testlib import FIXTURES, make_tree, run_cli

INTO = '''
  scale_into:
    doc: dest = input * scale, written into dest
    schema: "scale_into(Tensor dest, Tensor input, float scale) -> Tensor"
    reference: runtime.reference.toy:scale
    shader: scale
    fixed: {STORAGE: buffer}
    select: {DTYPE: dest.dtype}
    outputs:
      - {name: out, alias: dest}
    bind: {t_out: out, t_in: input}
    push: {numel: numel(input), scale: fp32(scale)}
    dispatch: {global: elementwise(out)}
'''


def test_an_aliased_output_is_the_arguments_upload(tmp_path, capsys):
    toy = (FIXTURES / "specs" / "toy.yaml").read_text().rstrip("\n") + "\n" + INTO
    tree = make_tree(tmp_path, {"toy.yaml": toy})
    status, _, err = run_cli("generate", tree, "--no-compile", capsys=capsys)
    assert status == 0, err
    stub = (tree["out"] / "ops" / "toy.py").read_text()
    record = stub[stub.index("def scale_into(") : stub.index("def _scale_into_fake(")]
    assert 'out = stream.upload(dest, v.binding("t_out"), op.label("dest"))' in record
    assert "stream.empty" not in record
    assert record.rstrip().endswith("return out")
    fake = stub[stub.index("def _scale_into_fake(") : stub.index("SCALE_INTO = rt.OpDef(")]
    assert "return torch.empty(dest.shape, dtype=dest.dtype, device=dest.device)" in fake
    opdef = stub[stub.index("SCALE_INTO = rt.OpDef(") :]
    assert '    aliases=((0, "dest"),),\n' in opdef
    # An op without aliases leaves the field at its default.
    assert "aliases=" not in stub[stub.index("SCALE = rt.OpDef(") : stub.index("def scale_into(")]
