# The two commands of the README. Each does its own set-up (scripts/setup_venv.sh).
PY := .venv/bin/python
STEPS ?= 50000
SEED ?= 0
ENV ?= CartPole-v1
AGENT ?= dqn

.PHONY: setup setup-core train test test-all test-ray test-long test-core lint bench digests reference docs clean

# .venv with one of the two stacks (scripts/setup_venv.sh): STACK=full (Python 3.10: Reverb, Launchpad) or
# STACK=core (Python 3.11-3.13, current JAX); unset, the stack .venv has, else full where a Python 3.10 is
# found, else core on the newest 3.11-3.13. ACCEL=cuda12 installs JAX's CUDA 12 wheels as well (the core
# also takes cuda13); unset, a venv keeps the accelerator it was set up with (cpu the first time).
setup:
	@STACK=$(STACK) ACCEL=$(ACCEL) bash scripts/setup_venv.sh

train: setup
	$(PY) -m launch.train --agent $(AGENT) --env $(ENV) --seed $(SEED) --steps $(STEPS)

# The fast tier (a few minutes): everything but the tests marked slow (learning to a threshold,
# real Launchpad programs, Slurm, whole commands), one pytest worker per core (PARALLEL; a test
# file's tests share a worker). `make test-all` runs both tiers (CI does): the fast one so, then the
# slow one two tests at a time (SLOW_PARALLEL; each worker takes the next test as it finishes one; the
# tests on the project's test hosts, one set per machine, come first and hold them one at a time:
# tests/conftest.py's holding_test_hosts).
# `make test-long` the learning runs of many minutes that CI leaves out (marked long).
PARALLEL ?= -n auto --dist loadfile
SLOW_PARALLEL ?= -n 2 --dist worksteal

test: setup
	bash scripts/run_tests.sh -m "not slow" $(PARALLEL) $(PYTEST_ARGS)

test-all: setup
	bash scripts/run_tests.sh -m "not slow" $(PARALLEL) $(PYTEST_ARGS); fast=$$?; \
	bash scripts/run_tests.sh -m "slow and not long" $(SLOW_PARALLEL) $(PYTEST_ARGS); slow=$$?; \
	[ $$fast -eq 0 ] && [ $$slow -eq 0 ]

# The distributed program on Ray (the core stack's engine; Ray does not install beside the full stack's
# TensorFlow): its slow tests, from .venv where it has the core stack, else .venv-core.
test-ray: setup
	@if [ "$$(cat .venv/.jrl-stack)" = core ]; then bash scripts/run_tests.sh -m "slow and needs_ray and not long"; \
	else $(MAKE) --no-print-directory setup-core && JRL_TEST_PYTHON=.venv-core/bin/python \
	bash scripts/run_tests.sh --core -m "slow and needs_ray and not long"; fi

test-long: setup
	bash scripts/run_tests.sh -m long $(PYTEST_ARGS)

# The core stack on Python 3.12 beside a full-stack .venv (.venv-core/, requirements-core-py312.txt): no
# Reverb, Launchpad or TensorFlow; tests that need them are deselected (tests/conftest.py). Where .venv has
# the core stack itself, `make test` already runs them so.
setup-core:
	@ACCEL=$(ACCEL) bash scripts/setup_core_venv.sh

test-core: setup-core
	JRL_TEST_PYTHON=.venv-core/bin/python bash scripts/run_tests.sh --core $(PYTEST_ARGS)

# The import layers and no cycles (pyproject.toml [tool.importlinter]); import-linter 2.16 runs
# on Python >= 3.11, so from a core venv: .venv where it has the core stack, else .venv-core.
lint: setup
	@if [ "$$(cat .venv/.jrl-stack)" = core ]; then .venv/bin/lint-imports; \
	else $(MAKE) --no-print-directory setup-core && .venv-core/bin/lint-imports; fi

bench: setup
	$(PY) bench/embedded_throughput.py

# The --deterministic and device parameter digests of every agent (compare before/after a redesign).
digests: setup
	$(PY) bench/digests.py --out digests.json

# The reference table (bench/reference.py): DQN and PPO on four MinAtar games, 3 seeds, beside the
# published values; per-run results into docs/results/, the page docs/results.md rebuilt from them.
# AGENT=ppo or AGENT=dqn runs one agent's part; STEPS=5000000 / 10000000 the published budgets.
reference: setup
	$(PY) bench/reference.py --agent $(if $(filter file,$(origin AGENT)),all,$(AGENT)) --steps $(if $(filter file,$(origin STEPS)),1000000,$(STEPS))

# The documentation site (docs/, mkdocs.yml) into build/site, with --strict.
docs: setup
	bash scripts/build_docs.sh

clean:
	rm -rf .venv .venv-core runs build
