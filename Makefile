# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps test demo bench

deps:
	bash tests/install-deps.sh

test: deps
	$(PY) -m pytest -q -ra

demo:
	$(PY) -m pip install -q torch==2.13.0 -e . && hangscope demo

bench:
	$(PY) bench/analysis.py
