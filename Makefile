# One command per job: `make test` installs what the tests need and runs every test (what CI runs).
PY ?= python3

.PHONY: deps test check demo bench bench-snapshot gpu-check

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

# On a GPU machine (one GPU or several), at most 8 minutes: installs what is missing, runs the GPU tests on this
# node, hangs a small NCCL job on purpose and investigates it; every output under $OUT (./gpu-check-out).
# Without a GPU it says so and runs hangscope's GPU code against the recorded fakes. bench/gpu_check.py says how.
gpu-check:
	$(PY) bench/gpu_check.py
