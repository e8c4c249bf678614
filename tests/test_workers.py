"""Local worker processes (`--workers N` of `specbench run` and `specbench tune`): a worker that fails is one
line naming the worker and its error, exit code 2."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from test_sweep import project  # noqa: F401 - a fixture


@pytest.mark.parametrize("command", ["run", "tune"])
def test_a_failed_worker_is_one_line_naming_it_and_exit_2(project, command):
    target = project / "target"
    target.unlink()
    target.mkdir()  # it exists, so the profile is valid; without a config.json each worker fails to load it
    result = CliRunner().invoke(app, [command, "tiny.toml", "--workers", "2", "--out", "out"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (f"error: worker 0 of 2 failed: ModelError: model folder has no config.json: "
                                     f"{target}; point to a Hugging Face model folder (worker 1 failed too)")
    assert "Traceback" not in result.output


def test_workers_take_a_visible_gpu_each_or_only_the_one_the_profile_names(monkeypatch):
    from specbench.scaleout.workers import WorkerError, worker_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,7")
    assert worker_gpus("cuda", workers=3) == worker_gpus("auto", workers=3) == ["3", "5", "7"]
    assert worker_gpus("cuda", workers=2) == ["3", "5"]
    with pytest.raises(WorkerError, match=r'^--workers 4: one GPU per worker, but 3 are visible; use --workers 3 or '
                                          r'fewer \(or device = "cuda:N" to share one GPU on purpose\)$'):
        worker_gpus("cuda", workers=4)
    assert worker_gpus("cuda:1", workers=4) == ["5"]  # shared on purpose
    assert worker_gpus("cuda:1") == ["5"]  # the profile's GPU, as the process numbers it, for every worker
    assert worker_gpus("cpu") == []
    with pytest.raises(WorkerError, match=r"^device cuda:3: only 3 GPU\(s\) are visible; use cuda:0..2"):
        worker_gpus("cuda:3")
