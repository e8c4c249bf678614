"""`specbench run --workers 2`: two local processes share one sweep and its folder, each launch group run by one of
them; every planned point ends in the run's files exactly once, with all its requests, and every speedup against the
folder's one baseline. A sweep is no longer shared through an Optuna study: `--storage`/`--study` say what to use."""

from __future__ import annotations

from test_sweep import assert_each_point_once, project, read, run_cli  # noqa: F401 - a fixture


def test_local_workers_share_one_sweep_and_a_second_run_resumes_it(project):
    result = run_cli("tiny.toml", "--workers", "2", "--out", "out")
    assert result.exit_code == 0, result.output
    assert_each_point_once(project / "out")
    points, requests = read(project / "out")
    drafts = points[points["method"] != "baseline"]
    assert drafts["speedup"].notna().all()  # each against the folder's baseline at its temperature
    again = run_cli("tiny.toml", "--workers", "2", "--out", "out")
    assert again.exit_code == 0, again.output
    after = read(project / "out")[1]
    assert after["e2e_ms"].tolist() == requests["e2e_ms"].tolist()  # the same measurements, not a rerun


def test_a_shared_study_for_run_is_refused_in_one_line_naming_shard(project):
    for option in ("--storage", "--study"):
        result = run_cli("tiny.toml", option, "x", "--out", "out")
        assert result.exit_code == 2
        assert len(result.output.strip().splitlines()) == 1 and "--shard I/N" in result.output
    assert not (project / "out").exists()
