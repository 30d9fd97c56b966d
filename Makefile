# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: env demo demo-reasoner test test-fast lint clean-home mutation

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

test: env
	$(PY) -m pytest -q

# Unit tests only: no flows, no servers.
test-fast: env
	$(PY) -m pytest -q -m "not slow"

# Mutation testing of the pure modules (pyproject [tool.mutmut]); slow, not part of `make test`.
# Prints every surviving mutant; `$(VENV)/bin/mutmut show NAME` shows one.
mutation: env
	$(PY) -m pip install --quiet -c constraints.txt -e '.[mutation]'
	cd $(CURDIR) && $(VENV)/bin/mutmut run --max-children 2 || true
	$(VENV)/bin/mutmut results
