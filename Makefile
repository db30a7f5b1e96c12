# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps test demo bench bench-snapshot

deps:
	bash tests/install-deps.sh

test: deps
	$(PY) -m pytest -q -ra

demo:
	$(PY) -m pip install -q torch==2.13.0 -e . && hangscope demo

bench:
	$(PY) bench/analysis.py

bench-snapshot:  # needs root: hangscope vs the ssh recipes and the floor, 4-32 fake nodes (docs/performance.md)
	$(PY) bench/snapshot.py
