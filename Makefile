# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps test check demo bench bench-snapshot

deps:
	bash tests/install-deps.sh

test: deps
	$(PY) -m pytest -q -ra --durations=25

# Static checks (configured in pyproject.toml): lint, types (app/ with this python, workers/ as the nodes'
# oldest python3, 3.9), the import contracts and import cycles, and the worker protocol's typed requests (both
# sides keep to the arguments workers/protocol.py declares): tests/layout.
check: deps
	$(PY) -m ruff check app workers tests bench
	$(PY) -m mypy app
	$(PY) -m mypy --python-version 3.9 workers
	$(PY) -m pytest -q -p no:cacheprovider tests/layout

demo:
	$(PY) -m pip install -q torch==2.13.0 -e . && hangscope demo

bench:
	$(PY) bench/analysis.py

bench-snapshot:  # needs root: hangscope vs the ssh recipes and the floor, 4-32 fake nodes (docs/performance.md)
	$(PY) bench/snapshot.py
