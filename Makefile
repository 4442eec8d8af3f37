# day0: `make run` starts the whole system on its defaults; `make test` runs the suite.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint format worker clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "day0 needs Python 3.11 or newer (found $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) manage.py migrate --noinput
	$(PY) manage.py collectstatic --noinput --verbosity 0
	$(PY) manage.py load_demo
	@# A watch that cannot be polled (offline hub, unmounted mirror) is shown on the board;
	@# it must not keep the rest of the system from starting.
	$(PY) manage.py poll_hubs --force || echo "Some hub watches could not be polled; see the board."
	@echo ""
	@echo "day0 is starting at http://$${DAY0_HOST:-127.0.0.1}:$${DAY0_PORT:-8000}/  (login: demo / day0-demo)"
	@echo "Web, a Celery worker for the cpu pool and beat run below; Ctrl-C stops them all."
	@echo ""
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/honcho start -f Procfile

test: install lint
	DAY0_VAR_DIR=$${DAY0_VAR_DIR:-var/test} $(PY) -m pytest $(PYTEST_ARGS)

# The development loop: lint, layering, and every test but the torch-heavy, browser and
# end-to-end ones (a few minutes less than `make test`, which still runs everything).
test-fast: install lint
	DAY0_VAR_DIR=$${DAY0_VAR_DIR:-var/test} $(PY) -m pytest -m "not slow and not browser and not e2e" $(PYTEST_ARGS)

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format:
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf var/test .pytest_cache .ruff_cache
