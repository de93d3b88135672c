# Everyday verbs. `make demo` and `make test` set the machine up first.
PY := .venv/bin/python
STAMP := .venv/.setup-done

.PHONY: setup generate spirv check test demo bench wheel wheel-test clean

# The environment, then the SPIR-V (a no-op when present): a prepared checkout runs ops.
setup: $(STAMP) spirv

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

generate: $(STAMP)
	$(PY) -m codegen generate
	$(PY) -m codegen docs

# The SPIR-V of generated/ (git-ignored, compiled from the committed GLSL); a no-op when present.
spirv: $(STAMP)
	$(PY) -m codegen compile

check: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m codegen check
	$(PY) -m codegen docs --check

test: $(STAMP) spirv
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m codegen generate
	$(PY) -m runtime demo

# Every kernel benchmark (tiny sizes on a CPU driver), then benchmarks/report/REPORT.md + PNGs.
bench: $(STAMP) spirv
	$(PY) benchmarks/codegen_bench.py
	$(PY) benchmarks/run_all.py

wheel: $(STAMP)
	$(PY) -m pip wheel -q --disable-pip-version-check --no-deps -w dist .

# The wheel in a fresh virtualenv outside the checkout, without glslc (scripts/wheel_smoke.sh).
wheel-test: $(STAMP)
	bash scripts/wheel_smoke.sh

clean:
	rm -rf .venv .pytest_cache .ruff_cache build dist generated/spv
