# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps test test-under-load check demo bench bench-snapshot

deps:
	bash tests/install-deps.sh

test: deps
	$(PY) -m pytest -q -ra --durations=25

# The suite beside one CPU burner per core (normal priority, started and killed here whatever pytest does): a
# test whose verdict depends on an idle machine fails here. Run it whenever a change touches tests or timing.
# PYTEST_ARGS picks tests (default: all of them).
test-under-load: deps
	@burners=""; trap 'kill $$burners 2>/dev/null; wait $$burners 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq "$$(nproc)"); do $(PY) -c 'while True: pass' & burners="$$burners $$!"; done; \
	echo "test-under-load: $$(nproc) CPU burners:$$burners"; \
	$(PY) -m pytest -q -ra --durations=25 $(PYTEST_ARGS)

# Static checks (configured in pyproject.toml): lint, types (app/ with this python, workers/ as the nodes'
# oldest python3, 3.9), and the import contracts and import cycles (one test, from the layout).
check: deps
	$(PY) -m ruff check app workers tests bench
	$(PY) -m mypy app
	$(PY) -m mypy --python-version 3.9 workers
	$(PY) -m pytest -q -p no:cacheprovider tests/layout/test_architecture.py

demo:
	$(PY) -m pip install -q torch==2.13.0 -e . && hangscope demo

bench:
	$(PY) bench/analysis.py

bench-snapshot:  # needs root: hangscope vs the ssh recipes and the floor, 4-32 fake nodes (docs/performance.md)
	$(PY) bench/snapshot.py
