# The two commands of the README. Each does its own set-up (scripts/setup_venv.sh).
PY := .venv/bin/python
STEPS ?= 50000
SEED ?= 0
ENV ?= CartPole-v1
AGENT ?= dqn

.PHONY: setup train test bench clean

setup:
	@bash scripts/setup_venv.sh

train: setup
	$(PY) -m launch.train --agent $(AGENT) --env $(ENV) --seed $(SEED) --steps $(STEPS)

test: setup
	bash scripts/run_tests.sh

bench: setup
	$(PY) bench/embedded_throughput.py

clean:
	rm -rf .venv runs
