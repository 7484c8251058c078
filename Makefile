# The project's commands. `make demo` and `make test` set everything up on a fresh machine.
VENV := .venv
PY := $(VENV)/bin/python
# Tests marked known_bug reproduce open bugs; run them with `make test PYTEST_ARGS=`.
PYTEST_ARGS ?= -m "not known_bug"

.PHONY: demo test test-fast test-ranks test-live bootstrap images lint testbed-up testbed-down bench clean

demo: bootstrap
	$(VENV)/bin/heterotrain demo

# Two workers: one runs the tests that train on this machine's cores, the other the control-plane and
# in-process ones (tests/conftest.py groups them), so waiting on one overlaps work on the other.
test: bootstrap lint
	$(PY) -m pytest -n 2 --dist loadgroup $(PYTEST_ARGS)

# The suite's lanes, by what a test needs: in process only (pure functions, the in-process fake API);
# real training ranks and other processes; a live control plane. `make test` runs all three.
test-fast:
	$(PY) -m pytest -m "not known_bug and not ranks and not testbed"

test-ranks: bootstrap
	$(PY) -m pytest -m "not known_bug and ranks and not testbed"

test-live: bootstrap
	$(PY) -m pytest -m "not known_bug and testbed"

bootstrap:
	bash testbed/bootstrap.sh

# The operator and trainer images from their Dockerfiles, with buildah on a debootstrapped Debian base
# (bootstrap builds them too; cached by content, so this rebuilds only what changed).
images: bootstrap
	$(VENV)/bin/heterotrain testbed images

lint:
	$(VENV)/bin/ruff check operator trainer_image tests bench
	$(VENV)/bin/ruff format --check operator trainer_image tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

testbed-up: bootstrap
	$(VENV)/bin/heterotrain testbed up

testbed-down:
	$(VENV)/bin/heterotrain testbed down

bench: bootstrap
	$(PY) bench/planner.py
	$(PY) bench/runtime_balance.py

clean:
	rm -rf demo-output .pytest_cache .mypy_cache .ruff_cache
