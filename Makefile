# Everyday verbs. `make demo` and `make test` set the machine up first.
PY := .venv/bin/python
STAMP := .venv/.setup-done

.PHONY: setup generate check test demo bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

generate: $(STAMP)
	$(PY) -m codegen generate
	$(PY) -m codegen docs

check: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m codegen check
	$(PY) -m codegen docs --check

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m codegen generate
	$(PY) -m runtime demo

bench: $(STAMP)
	$(PY) benchmarks/codegen_bench.py
	$(PY) benchmarks/runtime_bench.py

clean:
	rm -rf .venv .pytest_cache .ruff_cache
