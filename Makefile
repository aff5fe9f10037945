# hat-jax: two commands on a fresh machine — `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# 8 fake CPU devices so sharding code runs on one host (a no-op on accelerators' own devices).
FAKE_DEVICES := XLA_FLAGS="--xla_force_host_platform_device_count=8 $(XLA_FLAGS)"
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core up to 4; each module stays in one process, so a
# module's shared fixtures are built once, and modules go out in the order tests/conftest.py
# gives them (the slowest first). `make test TEST_WORKERS=0` runs in this process.
TEST_WORKERS ?= auto

.PHONY: demo reproduce test bench lint format lock clean

$(STAMP): requirements.lock requirements-nodeps.lock pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.lock
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m hat_jax.eval.setup_ifeval
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m launch.pipeline --config=configs/pipeline_demo.py

# The miniature reproduction of the paper's Table 3 (runs/reproduce/report.md).
reproduce: $(STAMP)
	$(PY) -m launch.reproduce --config=configs/reproduce.py

test: $(STAMP)
	$(FAKE_DEVICES) $(PY) -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadscope --no-loadscope-reorder \
		--durations 25 $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m pip install --quiet -c requirements.lock -e ".[bench]"
	$(PY) -m bench

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Re-resolve the lock from pyproject.toml in a throw-away venv, then run the tests against it.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet --upgrade pip
	.venv-lock/bin/pip install --quiet -e ".[test,dev,eval]"
	{ sed -n '1,/^# sglang/p' requirements.lock; \
	  .venv-lock/bin/pip freeze --exclude-editable | sed -E 's/^(torch==[0-9.]+)\+cpu$$/\1/'; } > requirements.lock.new
	mv requirements.lock.new requirements.lock
	rm -rf .venv-lock
	$(MAKE) test

clean:
	rm -rf $(VENV) .pytest_cache runs
