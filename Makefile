# Two commands do all the set-up on a fresh machine:
#   make demo   - runs the main job (a local Ray cluster, 4 workers with emulated speeds)
#   make test   - type-checks (mypy) and runs the whole test suite: the unit and end-to-end tiers in
#                 two processes (unit tests are pure CPU work, one core each; end-to-end tests are
#                 separate programs, each on a private Ray instance, waiting on process starts much of
#                 the time), then the GPU and Ray tiers in one (the Ray tier's tests share one cluster
#                 per module and some read timings: nothing else runs beside them). Files are handed
#                 out in the order given, the long end-to-end ones first and the many short unit files
#                 last, so both processes finish together (xdist's default order, by test count, left
#                 the longest one-test files, the demo and the local cluster, to the end)
# Both create (or reuse) the virtual environment in $(VENV).
PYTHON ?= python3
VENV ?= .venv
# CPU build by default (it lies on local disk here). On a GPU cluster: make TORCH_SPEC=torch venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pdml-installed

.PHONY: venv demo test unit bench-quick gpu-check clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

demo: venv
	$(VENV)/bin/pdml-ray demo

test: venv
	$(PY) -m mypy
	-sh scripts/install_test_tools.sh
	$(PY) -m pytest -q -rs --durations=15 -p no:cacheprovider -n 2 --dist loadfile --no-loadscope-reorder \
		tests/e2e tests/unit
	$(PY) -m pytest -q -rs --durations=25 -p no:cacheprovider tests/gpu tests/ray

unit: venv
	$(PY) -m pytest -q -rs -p no:cacheprovider tests/unit

bench-quick: venv
	mkdir -p results
	$(VENV)/bin/pdml-ray bench hetero --quick --json results/hetero.json
	$(VENV)/bin/pdml-ray bench sampling --quick --json results/sampling.json
	$(VENV)/bin/pdml-ray bench pipeline --quick --json results/pipeline.json

# The one check for a machine with GPUs (never part of `make test`): every GPU test and
# examples/gpu_check.py, one JSON in results/gpu_check.json. It builds the venv with the CUDA build of
# torch itself; without a GPU it says so, installs nothing and exits 0. See docs/gpu_cluster.md.
gpu-check:
	sh scripts/gpu_check.sh results/gpu_check.json

clean:
	rm -rf $(VENV) build *.egg-info results
