# Entry points. Everything runs inside .venv/, created here by uv (itself bootstrapped into .tools/).
PYTHON ?= python3
UV_VERSION := 0.13.8
UV := .tools/bin/uv
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install serve test check lint typecheck unit bench openapi clean

$(UV):
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --target .tools uv==$(UV_VERSION)

$(VENV)/.installed: $(UV) pyproject.toml service/pyproject.toml client/pyproject.toml uv.lock
	UV_PYTHON_DOWNLOADS=never PYTHONPATH=.tools $(UV) sync --all-packages --locked --python $(PYTHON)
	touch $@

install: $(VENV)/.installed ## create .venv/ with the service, the client and the dev tools

uv.lock: pyproject.toml service/pyproject.toml client/pyproject.toml
	PYTHONPATH=.tools $(UV) lock

serve: install ## run the server on $(HOST):$(PORT), NumPy backend unless TENSORBITS_BACKEND says otherwise
	TENSORBITS_BACKEND=$${TENSORBITS_BACKEND:-numpy} $(BIN)/tensorbits serve --host $(HOST) --port $(PORT)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest

check: lint typecheck

test: check unit ## every check: lint, types, the whole test suite

bench: install ## operator core on the CPU; bench/http_service.py, bench/in_process.py, bench/client.py and bench/load.py measure the rest
	$(BIN)/python bench/ops.py

openapi: install ## regenerate openapi/openapi.json from the app
	$(BIN)/python scripts/export_openapi.py

clean:
	rm -rf $(VENV) .tools .mypy_cache .ruff_cache .pytest_cache .hypothesis
