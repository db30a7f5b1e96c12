# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps bytecode test test-under-load check demo bench bench-snapshot gpu-check

deps:
	bash tests/install-deps.sh

# The checkout's bytecode, written once before the tests, as a pip install ships it: with an editable install
# and PYTHONDONTWRITEBYTECODE set (as on CI), every hangscope process the tests start (the CLI, sessions, the
# worker payload's packing) would compile the same ~200 modules again (tests/cli/test_cli.py: 13.6 -> 9.7 CPU-s).
# Python checks each file's mtime, so an edited module is compiled afresh and never read stale.
bytecode:
	$(PY) -m compileall -q -j 0 app workers tests bench

test: deps bytecode
	$(PY) -m pytest -q -ra --durations=25

# The suite beside one CPU burner per core (normal priority, started and killed here whatever pytest does): a
# test whose verdict depends on an idle machine fails here. Run it whenever a change touches tests or timing.
# PYTEST_ARGS picks tests (default: all of them).
test-under-load: deps bytecode
	@burners=""; trap 'kill $$burners 2>/dev/null; wait $$burners 2>/dev/null' EXIT INT TERM; \
	for i in $$(seq "$$(nproc)"); do $(PY) -c 'while True: pass' & burners="$$burners $$!"; done; \
	echo "test-under-load: $$(nproc) CPU burners:$$burners"; \
	$(PY) -m pytest -q -ra --durations=25 $(PYTEST_ARGS)

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

# On a GPU machine (one GPU or several), at most 8 minutes: installs what is missing, runs the GPU tests on this
# node, hangs a small NCCL job on purpose and investigates it; every output under $OUT (./gpu-check-out).
# Without a GPU it says so and runs hangscope's GPU code against the recorded fakes. bench/gpu_check.py says how.
gpu-check:
	$(PY) bench/gpu_check.py
