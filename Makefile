# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: env demo demo-reasoner test test-fast rehearse gpu-check lint clean-home mutation

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned: the CPU build; an unpinned torch pulls gigabytes of CUDA.
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

env: $(STAMP)

demo: env
	$(VENV)/bin/embodied-r demo

# Embodied-Reasoner on the CPU: synthetic data, tiny VLM, built-in household environment.
demo-reasoner: env
	$(VENV)/bin/embodied-r reasoner --recipe reasoner-demo

# Two test processes (pytest-xdist), each test file whole to one of them, so a file's module
# fixtures are built once; the longest files first (tests/conftest.py, LONGEST_FIRST).
TEST_WORKERS ?= 2
test: env
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not e2e"

# The end-to-end runs: the demo learning, whole pipelines deployed to real Prefect servers and
# workers, MLflow servers killed and restarted under a run, disks that fill mid-stage.
test-e2e: env
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m e2e

# Unit tests only: no flows, no servers.
test-fast: env
	$(PY) -m pytest -q -m "not slow"

# The GPU recipes rehearsed on this CPU with their real engines (vLLM's CPU build, DeepSpeed
# ZeRO-3 over 2 processes, two nodes on 127.0.0.1, the gpu-train pool), one line per item, in the
# CPU replica of the GPU training environment (built once per pins, about 3 minutes cold).
rehearse: env
	bash infra/training/rehearse.sh

# What to run first on a GPU machine: the GPU-marked tests, then each GPU check in its own
# process (backend in bf16, a GRPO step per reward schedule, SFT, accelerate launch, and the
# recipe's own policy timed and measured), as a table ending `gpu-check: N passed, M failed`.
# In the training environment (`infra/install-env.sh train`) when it exists. Options:
#   make gpu-check GPU_CHECK_ARGS='--recipe single-gpu --completion-tokens 512'
GPU_PY ?= $(firstword $(wildcard .venv-train/bin/python) $(PY))
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_PY) -m embodied_r.apps.cli check gpu $(GPU_CHECK_ARGS)

# Mutation testing of the pure modules (pyproject [tool.mutmut]); slow, not part of `make test`.
# Prints every surviving mutant; `$(VENV)/bin/mutmut show NAME` shows one. A part at a time
# (minutes rather than an hour), by mutant names as `mutmut results` prints them:
#   make mutation MUTANTS='embodied_r.training.records.*'
#   make mutation MUTANTS='$(CATALOG_SPLITS)'   (the split functions of data/catalog.py)
# One thread for torch and the tokenizers: mutmut forks a worker per mutant, and a thread pool
# started before the fork hangs or crashes the worker, which mutmut would count as a kill.
MUTANTS ?=
CATALOG_SPLITS := $(foreach f,x__stable_rank x_assign_splits x__cap x_split_counts x_metric_counts x_metric_name,\
                    embodied_r.data.catalog.$(f)__*)
mutation: env
	$(PY) -m pip install --quiet -c constraints.txt -e '.[mutation]'
	cd $(CURDIR) && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
		nice -n 10 $(VENV)/bin/mutmut run --max-children 2 $(foreach m,$(MUTANTS),'$(m)') || true
	$(VENV)/bin/mutmut results
