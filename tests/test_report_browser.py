"""The HTML report in a real browser: headless chromium loads it without errors, every plot decodes,
and a screenshot renders. Skipped only when chromium is not installed (.ci/run installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest

from specbench.report import Format, build_report, render
from test_report import PNG_TAG, RUN_A, RUN_B, write_run
from test_report_capacity import DOCUMENT
from test_report_server_load import server_manifest, write_server_run
from test_report_tune import write_tune

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (.ci/run installs it: apt-get install -y chromium)")

OFFLINE_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--enable-logging=stderr"]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    return subprocess.run([CHROMIUM, *OFFLINE_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=90)


@pytest.fixture
def report_html(tmp_path: Path) -> Path:
    report = build_report([write_run(tmp_path / "a", RUN_A), write_run(tmp_path / "b", RUN_B)])
    path = tmp_path / "report.html"
    path.write_text(render(report, Format.html))
    return path


@pytest.fixture
def tune_html(tmp_path: Path) -> Path:
    path = tmp_path / "tune.html"
    path.write_text(render(build_report([write_tune(tmp_path / "tune")]), Format.html))
    return path


@pytest.fixture
def load_html(tmp_path: Path) -> Path:
    """A server run under load (concurrency levels and request rates) with a capacity search."""
    run = write_server_run(tmp_path / "vllm-cpu-load", server_manifest())
    (run / "capacity.json").write_text(json.dumps(DOCUMENT))
    path = tmp_path / "load.html"
    path.write_text(render(build_report([run]), Format.html))
    return path


def test_the_report_loads_without_errors_and_every_image_decodes(tmp_path, report_html):
    n_images = report_html.read_text().count(PNG_TAG)
    assert n_images == 5 + 2  # run a: every plot; run b: no per-position, prediction or memory data
    check_loaded(tmp_path, report_html, n_images)


def test_the_tune_report_loads_with_its_trial_and_importance_plots(tmp_path, tune_html):
    html = tune_html.read_text()
    assert html.count(PNG_TAG) == 4 and 'alt="Objective by trial"' in html and 'alt="Parameter importances"' in html
    check_loaded(tmp_path, tune_html, 4)


def check_loaded(tmp_path: Path, page: Path, n_images: int) -> None:
    done = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert f'data-images-decoded="{n_images}/{n_images}"' in dom  # written by the page's load handler
    assert "data-errors" not in dom and "Uncaught" not in done.stderr
    widths = re.findall(r'data-natural-width="(\d+)"', dom)
    heights = re.findall(r'data-natural-height="(\d+)"', dom)
    assert len(widths) == len(heights) == n_images
    assert all(int(w) > 100 for w in widths) and all(int(h) > 100 for h in heights)


def test_a_screenshot_of_the_report_renders(tmp_path, report_html):
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", report_html.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    image = matplotlib.image.imread(shot)
    assert image.shape[:2] == (2000, 1280)
    assert image[..., :3].std() > 0.05  # tables and plots, not a blank page


def test_a_report_under_load_fits_a_narrow_window_its_wide_tables_scrolling_in_their_own_box(tmp_path, load_html):
    n_images = load_html.read_text().count(PNG_TAG)
    assert n_images == 4  # speedup vs gamma and vs load, the category heatmap, capacity at temperature 0 (not 0.8)
    check_loaded(tmp_path, load_html, n_images)
    done = chromium(tmp_path, "--window-size=800,2000", "--dump-dom", load_html.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    page, window = map(int, re.search(r'data-page-width="(\d+)/(\d+)"', done.stdout).groups())
    assert page <= window  # nothing runs off the right edge: the page never scrolls sideways
    assert int(re.search(r'data-scrolling-tables="(\d+)"', done.stdout)[1]) >= 1  # the point table does, in its box
