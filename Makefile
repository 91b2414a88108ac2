# The two commands of the README. Each does its own set-up (scripts/setup_venv.sh).
PY := .venv/bin/python
STEPS ?= 50000
SEED ?= 0
ENV ?= CartPole-v1
AGENT ?= dqn

.PHONY: setup setup-core train test test-core bench clean

setup:
	@bash scripts/setup_venv.sh

train: setup
	$(PY) -m launch.train --agent $(AGENT) --env $(ENV) --seed $(SEED) --steps $(STEPS)

test: setup
	bash scripts/run_tests.sh

# The pure core on Python 3.12 (.venv-core/, requirements-core-py312.txt): no Reverb, Launchpad or
# TensorFlow; tests marked distributed or device are deselected (tests/conftest.py).
setup-core:
	@bash scripts/setup_core_venv.sh

test-core: setup-core
	JRL_TEST_PYTHON=.venv-core/bin/python bash scripts/run_tests.sh --core $(PYTEST_ARGS)

bench: setup
	$(PY) bench/embedded_throughput.py

clean:
	rm -rf .venv .venv-core runs
