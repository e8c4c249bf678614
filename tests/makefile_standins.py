"""What the Makefile asks the machine, stood in for: a copy of the files make reads, a folder first on PATH holding
`nvidia-smi`, `nvcc` and `cmake` scripts that print what the real ones print, and an empty ENGINES_DIR. The tests of
tests/test_install.py and tests/test_install_drivers.py run `make -n` (what would run) against them, or make itself up
to a one-line refusal: nothing is installed, nothing is fetched."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

GPU_LINE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
# driver branch: (driver version, the newest CUDA it runs, as nvidia-smi's header says)
DRIVERS = {"580": ("580.65.06", "13.0"), "550": ("550.54.15", "12.4"), "535": ("535.183.01", "12.2"),
           "470": ("470.256.02", "11.4")}
# nvidia-smi with no argument, as an R550 driver prints its first lines
HEADER = """Tue Oct 29 10:00:00 2024
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
|   0  NVIDIA H100 80GB HBM3          On  |   00000000:18:00.0 Off |                    0 |
"""
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release {release}, V{release}.88
Build cuda_{release}.r{release}/compiler.36424714_0
"""
CMAKE_VERSION = "cmake version {version}\n\nCMake suite maintained and supported by Kitware (kitware.com/cmake).\n"
# what the tests take out of make's environment, so that the machine running them decides nothing
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GPU", "NVCC", "PYTHON", "VENV", "TORCH_INDEX", "TORCH_SPEC",
                  "PROFILE", "ENGINES_DIR", "DRIVER_CUDA", "CUDA_ARCHITECTURES")


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def printing(text: str) -> str:
    """A shell command printing `text` exactly."""
    return "cat <<'EOF'\n" + text + "EOF\n"


@dataclass
class Checkout:
    """A copy of the files make reads, a folder first on PATH for the stand-ins, and an empty ENGINES_DIR."""

    root: Path
    bin: Path
    engines: Path

    def nvidia_smi(self, *, gpus: str = GPU_LINE, status: int = 0, driver: str = "580", cuda: str | None = None,
                   caps: tuple[str, ...] = ("9.0",)) -> None:
        """nvidia-smi for a driver of this branch (`cuda` replaces what its header says, "N/A" say), answering `-L`,
        no argument (the header) and the two queries the Makefile makes."""
        version, newest = DRIVERS[driver]
        answers = {
            "": HEADER.format(driver=version, cuda=cuda or newest),
            "--query-gpu=driver_version --format=csv,noheader": "".join(f"{version}\n" for _ in caps),
            "--query-gpu=compute_cap --format=csv,noheader": "".join(f"{cap}\n" for cap in caps),
        }
        script(self.bin / "nvidia-smi", 'case "$*" in\n' + f'  -L) echo "{gpus}"; exit {status};;\n'
               + "".join(f'  "{args}") {printing(text)};;\n' for args, text in answers.items())
               + '  *) echo "nvidia-smi stand-in: no answer for $*" >&2; exit 2;;\nesac\n')

    def nvcc(self, release: str = "13.0") -> Path:
        return script(self.bin / "nvcc", printing(NVCC_VERSION.format(release=release)))

    def cmake(self, version: str) -> None:
        script(self.bin / "cmake", printing(CMAKE_VERSION.format(version=version)))

    def make(self, *args: str, dry_run: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}
        env["PATH"] = f"{self.bin}{os.pathsep}{env['PATH']}"
        command = ["make", "--no-print-directory", *(["-n"] if dry_run else []), f"ENGINES_DIR={self.engines}",
                   "JOBS=4", *args]
        return subprocess.run(command, cwd=self.root, env=env, capture_output=True, text=True, timeout=30)


@pytest.fixture
def checkout(tmp_path) -> Checkout:
    """A machine with no GPU: no nvidia-smi stand-in (the tests that need the real one hidden hide it), CMake 3.28."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, root / name)
    made = Checkout(root=root, bin=tmp_path / "bin", engines=tmp_path / "engines")
    made.cmake("3.28.3")
    return made


@pytest.fixture
def gpu(checkout) -> Checkout:
    """A GPU machine as today's pins want it: an R580 driver (CUDA 13.0), nvcc 13.0, CMake 3.28."""
    checkout.nvidia_smi()
    checkout.nvcc()
    return checkout


def dry_run(checkout: Checkout, *args: str) -> str:
    done = checkout.make(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def lines(text: str) -> list[str]:
    return text.splitlines()
