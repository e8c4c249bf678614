"""`specbench run --workers 2`: two local processes share one sweep and its folder, each launch group run by one of
them; every planned point ends in the run's files exactly once, with all its requests, and every speedup against the
folder's one baseline. A sweep is no longer shared through an Optuna study: `--storage`/`--study` say what to use."""

from __future__ import annotations

import re

from test_sweep import assert_each_point_once, project, read, run_cli  # noqa: F401 - a fixture


def test_local_workers_share_one_sweep_and_a_second_run_resumes_it(project):
    result = run_cli("tiny.toml", "--workers", "2", "--out", "out")
    assert result.exit_code == 0, result.output
    assert_each_point_once(project / "out")
    points, requests = read(project / "out")
    drafts = points[points["method"] != "baseline"]
    assert drafts["speedup"].notna().all()  # each against the folder's baseline at its temperature
    # not a terminal: the workers' progress in the launcher's job log, a line per point started and finished
    lines = result.output.splitlines()
    assert sum(f"sweep: {len(points)} points, {len(points)} to run, 0 resumed" in line for line in lines) == 1
    assert all(any(f"worker {index}: loading target" in line for line in lines) for index in (0, 1))
    for point_id in points["point_id"]:
        said = [line for line in lines if re.search(rf" point \d+/{len(points)} {point_id}: ", line)]
        assert len(said) == 2 and ": started, " in said[0] and re.search(r": (ok|unstable), ", said[1]), said
        sent = re.search(r": started, (\d+) requests?$", said[0]).group(1)
        assert f", {sent}/{sent} requests (0 failed), " in said[1], said  # its own requests, whatever else ran
    again = run_cli("tiny.toml", "--workers", "2", "--out", "out")
    assert again.exit_code == 0, again.output
    assert f"sweep: {len(points)} points, 0 to run, {len(points)} resumed" in again.output
    after = read(project / "out")[1]
    assert after["e2e_ms"].tolist() == requests["e2e_ms"].tolist()  # the same measurements, not a rerun


def test_a_shared_study_for_run_is_refused_in_one_line_naming_shard(project):
    for option in ("--storage", "--study"):
        result = run_cli("tiny.toml", option, "x", "--out", "out")
        assert result.exit_code == 2
        assert len(result.output.strip().splitlines()) == 1 and "--shard I/N" in result.output
    assert not (project / "out").exists()
