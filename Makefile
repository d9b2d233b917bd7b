# Sluice: `make run` brings the whole service up, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint format bench install clean

$(STAMP): pyproject.toml
	@echo "[sluice] creating $(VENV) and installing the project (the first time compiles llama.cpp, about 5 minutes)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --progress-bar on "pip>=24"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m chatsite.stack run

test: $(STAMP)
	$(BIN)/python -m chatsite.stack test $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: $(STAMP)
	$(BIN)/python -m chatsite.stack bench

clean:
	rm -rf $(VENV) var/test
