"""Packaging: the distribution is `specbench-llm` ("specbench" on PyPI is another project), the command and the
import stay `specbench`, and the wheel that `pip install .` / `pipx install .` builds carries the prompt data."""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

import specbench

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "specbench"
DISTRIBUTION = "specbench-llm"


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def package_files() -> set[str]:
    """Every file of the package in the source tree, as wheel member names (specbench/...)."""
    return {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"}


def test_the_distribution_is_specbench_llm(pyproject):
    assert pyproject["project"]["name"] == DISTRIBUTION


def test_the_command_is_specbench_and_runs_the_typer_app(pyproject):
    assert pyproject["project"]["scripts"] == {"specbench": "specbench.cli:app"}
    from specbench.cli import app
    assert app is not None


def test_the_version_in_pyproject_is_the_package_version(pyproject):
    assert pyproject["project"]["version"] == specbench.__version__


def test_only_the_specbench_package_is_found(pyproject):
    assert pyproject["tool"]["setuptools"]["packages"]["find"]["include"] == ["specbench*"]


def test_package_data_covers_every_data_file(pyproject):
    patterns = pyproject["tool"]["setuptools"]["package-data"]["specbench"]
    data = {path for path in (PACKAGE / "data").rglob("*") if path.is_file()}
    assert any(path.suffix == ".jsonl" for path in data)
    covered = {path for pattern in patterns for path in PACKAGE.glob(pattern) if path.is_file()}
    assert data <= covered, f"not in package-data: {sorted(str(p) for p in data - covered)}"


def test_nothing_asks_for_the_metadata_of_a_specbench_distribution():
    """importlib.metadata.version("specbench") would find the other project's distribution, or nothing."""
    asks = re.compile(r"""\b(version|distribution|metadata|requires)\(\s*["']specbench["']\s*\)""")
    offenders = [str(path.relative_to(ROOT)) for folder in (PACKAGE, ROOT / "tests") for path in folder.rglob("*.py")
                 if path != Path(__file__) and asks.search(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_wheel_holds_the_package_its_data_and_the_command(tmp_path):
    """Build the wheel `pip install .` installs (from a copy of the tree, so the clone gets no build output),
    without build isolation, so no network."""
    pytest.importorskip("setuptools")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(PACKAGE, source / "specbench", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    wheels = tmp_path / "wheels"
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                             "--quiet", "--disable-pip-version-check", "-w", str(wheels), str(source)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = wheels.glob("*.whl")
    assert wheel.name == f"specbench_llm-{specbench.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        info = f"specbench_llm-{specbench.__version__}.dist-info"
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
    missing = package_files() - members
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert any(re.fullmatch(r"specbench/data/prompts/[^/]+\.jsonl", name) for name in members)
    assert {name.split("/")[0] for name in members} == {"specbench", info}
    assert re.search(r"^\[console_scripts\]\s*\nspecbench = specbench\.cli:app\s*$", entry_points, re.M)
    assert (metadata["Name"], metadata["Version"]) == (DISTRIBUTION, specbench.__version__)
