"""Wheel build: bundle the built-in generated folder and templates into the packages.

Everything else is in pyproject.toml. A wheel holds, besides the `codegen`
and `runtime` packages:

- ``runtime/_generated/``: ``manifest.json``, the stub modules ``ops/*.py``
  and ``spv/<key>.spv``, the SPIR-V of every variant, compiled from the
  committed GLSL and checked with spirv-val (`codegen.glslc.compile_folder`;
  building needs glslc and spirv-val, and glslangValidator for cooperative-
  matrix shaders not compiled yet under generated/spv; installing does not);
- ``codegen/templates/``: the built-in templates, which a user's own
  templates may include.

An editable install bundles nothing: the runtime and codegen find the
checkout's ``generated/`` and ``templates/``.
"""

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    """`build_py` that also bundles generated/ (with compiled SPIR-V) and templates/."""

    def run(self):
        super().run()
        if self.editable_mode:
            return
        sys.path.insert(0, str(ROOT))
        from codegen.glslc import CompileError, compile_folder

        generated = ROOT / "generated"
        try:
            binaries = compile_folder(generated, progress=True)
        except CompileError as exc:
            raise SystemExit(f"cannot build the wheel's SPIR-V:\n{exc}") from None
        bundle = Path(self.build_lib) / "runtime" / "_generated"
        shutil.rmtree(bundle, ignore_errors=True)
        (bundle / "spv").mkdir(parents=True)
        shutil.copy2(generated / "manifest.json", bundle / "manifest.json")
        shutil.copytree(generated / "ops", bundle / "ops", ignore=shutil.ignore_patterns("__pycache__"))
        for path in binaries.values():
            shutil.copy2(path, bundle / "spv" / path.name)
        templates = Path(self.build_lib) / "codegen" / "templates"
        shutil.rmtree(templates, ignore_errors=True)
        shutil.copytree(ROOT / "templates", templates)


setup(cmdclass={"build_py": BuildPy})
