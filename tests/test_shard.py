"""`specbench run --shard I/N` and `specbench merge`: the split (each configuration on one shard, every baseline on
each), the index from a scheduler's environment, two shards on two "machines" (host names) merged into the set of
points one run plans with every speedup against its own host's baseline, and bad input."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.backends.server.backend import launch_key
from specbench.cli import app
from specbench.profile import profile_from_dict
from specbench.sweep.plan import plan_points
from specbench.sweep.shard import ShardError, parse_shard, shard_points, unit_key
from tiny import tiny_profile, write_project

PROMPTS = [("the cat sat on the mat and the dog ran fast", "chat"),
           ("write code to sum one two three four five", "code")]


def _server_plan():
    return plan_points(profile_from_dict({
        "name": "s", "backend": "server", "server": {"engine": "vllm"}, "target": {"model": "org/target"},
        "drafts": [{"name": "ngram", "method": "ngram"}, {"name": "self", "method": "draft", "model": "org/target"}],
        "sweep": {"gamma": [1, 2, 3], "temperature": [0.0, 0.8], "concurrency": [1, 4]},
        "workload": {"prompts": "builtin:mixed"}}), launch_key=launch_key)


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_each_launch_runs_on_one_shard_and_every_shard_runs_the_baselines(count):
    planned = _server_plan()
    shards = [shard_points(planned, launch_key, parse_shard(f"{i}/{count}", {})) for i in range(1, count + 1)]
    baselines = [spec for spec in planned if spec.method == "baseline"]
    owners: dict = {}
    for index, specs in enumerate(shards):
        assert [spec for spec in specs if spec.method == "baseline"] == baselines
        for spec in specs:
            if spec.method != "baseline":
                owners.setdefault(launch_key(spec), set()).add(index)
    assert all(len(owner) == 1 for owner in owners.values())  # an engine configuration is launched by one shard
    drafted = [spec for specs in shards for spec in specs if spec.method != "baseline"]
    assert sorted(s.point_id for s in drafted) == sorted(s.point_id for s in planned if s.method != "baseline")
    sizes = [len(specs) - len(baselines) for specs in shards]
    assert max(sizes) - min(sizes) <= 4  # six launches of 4 points each, balanced by points
    again = [shard_points(planned, launch_key, parse_shard(f"{i}/{count}", {})) for i in range(1, count + 1)]
    assert again == shards  # deterministic: every copy of the command computes the same split
    assert len({unit_key(s, launch_key) for s in drafted}) == 6


def test_the_index_comes_from_the_scheduler_or_is_refused_in_one_line():
    assert parse_shard("auto/4", {"JOB_COMPLETION_INDEX": "0"}).index == 1
    assert parse_shard("auto/4", {"SLURM_ARRAY_TASK_ID": "7", "SLURM_ARRAY_TASK_MIN": "5"}).index == 3
    assert parse_shard("2/4", {"SPECBENCH_HOST": "box-b"}).host == "box-b"
    for text, words in (("3/2", "must lie in 1..2"), ("0/2", "must lie in 1..2"), ("2", "expected I/N"),
                        ("auto/2", "neither JOB_COMPLETION_INDEX")):
        with pytest.raises(ShardError, match=words):
            parse_shard(text, {})


@pytest.fixture(scope="module")
def shards(tmp_path_factory, models_dir):
    """A tiny project run as shards 1/2 on "box-a" and 2/2 on "box-b" (their host names), once for the module:
    (the project folder, the two shard folders). Tests copy a folder before changing it."""
    project = write_project(tmp_path_factory.mktemp("shards"), prompts=PROMPTS, models=models_dir,
                            profile=tiny_profile(gamma=(2, 3), temperature=(0.0,), max_new_tokens=12, repeats=1,
                                                 warmup=0))
    folders = [project / "results" / f"tiny-shard{i}of2" for i in (1, 2)]
    for index, host in ((1, "box-a"), (2, "box-b")):
        result = CliRunner().invoke(app, ["run", str(project / "tiny.toml"), "--shard", f"{index}/2", "--out",
                                          str(folders[index - 1])], env={"SPECBENCH_HOST": host})
        assert result.exit_code == 0, result.output
    return project, folders


def test_two_shards_on_two_hosts_merge_into_one_runs_points(shards, tmp_path, monkeypatch):
    project, folders = shards
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    manifests = [json.loads((folder / "manifest.json").read_text()) for folder in folders]
    assert [m["shard"]["host"] for m in manifests] == ["box-a", "box-b"]
    parts = [pd.read_parquet(folder / "points.parquet") for folder in folders]
    drafted = [set(part.loc[part["method"] != "baseline", "point_id"]) for part in parts]
    assert drafted[0] and drafted[1] and not drafted[0] & drafted[1]
    assert all((part["method"] == "baseline").sum() == 1 for part in parts)

    result = runner.invoke(app, ["merge", *map(str, folders), "--out", "merged"])
    assert result.exit_code == 0, result.output
    merged = pd.read_parquet(tmp_path / "merged" / "points.parquet")
    whole = {spec.point_id for spec in plan_points(profile_from_dict(
        tomllib.loads((project / "tiny.toml").read_text()), source=project / "tiny.toml"))}
    expected = (whole - {"baseline-t0-p1"}) | {"baseline-t0-p1@box-a", "baseline-t0-p1@box-b"}
    assert set(merged["point_id"]) == expected and merged["point_id"].is_unique
    for part, host in zip(parts, ("box-a", "box-b")):  # every speedup is its own host's
        mine = merged[merged["host"] == host].set_index("point_id")
        for row in part[part["method"] != "baseline"].to_dict("records"):
            assert mine.loc[row["point_id"], "speedup"] == row["speedup"]
            assert mine.loc[row["point_id"], "shard"] in ("1/2", "2/2")
    requests = pd.read_parquet(tmp_path / "merged" / "requests.parquet")
    assert set(requests["point_id"]) == expected
    report = runner.invoke(app, ["report", "merged", "--format", "json"])
    assert report.exit_code == 0, report.output
    assert {row["point_id"] for row in json.loads(report.output)["points"]} == expected
    assert {row["host"] for row in json.loads(report.output)["points"]} == {"box-a", "box-b"}
    shown = runner.invoke(app, ["report", "merged"], env={"COLUMNS": "200"}).output
    assert "host" in shown and "box-b" in shown

    # bad input: one line, exit 2, nothing written
    result = runner.invoke(app, ["merge", str(folders[0]), "--out", "one"])
    assert result.exit_code == 2 and "two result folders" in result.output and not (tmp_path / "one").exists()
    other = tmp_path / "other"
    other.mkdir()
    for name in ("points.parquet", "requests.parquet"):
        (other / name).write_bytes((folders[1] / name).read_bytes())
    manifest = json.loads((folders[1] / "manifest.json").read_text())
    manifest["profile"]["target"]["model"] = "someone/else"
    (other / "manifest.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["merge", str(folders[0]), str(other), "--out", "mixed"])
    assert result.exit_code == 2 and "someone/else" in result.output and not (tmp_path / "mixed").exists()
    result = runner.invoke(app, ["merge", str(folders[0]), "--out", "missing", str(folders[0])])
    assert result.exit_code == 2 and "given twice" in result.output
    result = runner.invoke(app, ["run", str(project / "tiny.toml"), "--shard", "2/2", "--out", str(folders[0])])
    assert result.exit_code == 2 and "holds shard 1/2, this is shard 2/2" in result.output


@pytest.mark.parametrize("args, words", [
    (["--shard", "3/2"], "must lie in 1..2"),
    (["--shard", "1/2", "--workers", "2"], "drop --workers"),
    (["--shard", "1/2", "--storage", "postgresql://db/specbench"], "split it across machines with --shard I/N"),
])
def test_a_bad_shard_is_one_line_exit_2_and_nothing_written(tmp_path, models_dir, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, profile=tiny_profile(), prompts=PROMPTS, models=models_dir)
    result = CliRunner().invoke(app, ["run", "tiny.toml", *args])
    assert result.exit_code == 2 and words in result.output and "\n" not in result.output.strip()
    assert not (tmp_path / "results").exists()


def _blocks(language: str) -> list[str]:
    text = (Path(__file__).parents[1] / "docs" / "scaleout.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_kubernetes_and_slurm_examples_run_their_command_with_a_local_index(tmp_path, models_dir, monkeypatch):
    """The Indexed Job and the job array from docs/scaleout.md: parsed, and their command run as each copy would
    (the tiny models' profile in place of the GPU one), then the merge the page gives."""
    import yaml

    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, profile=tiny_profile(gamma=(2, 3), temperature=(0.0,), max_new_tokens=8, repeats=1,
                                                 warmup=0), prompts=PROMPTS, models=models_dir)
    job = next(job for job in map(yaml.safe_load, _blocks("yaml")) if job["metadata"]["name"] == "specbench-sweep")
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    count = job["spec"]["completions"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["specbench", "run"] and command[command.index("--shard") + 1] == f"auto/{count}"
    runner = CliRunner()
    for index in (0, count - 1):  # the first and the last copy
        args = ["tiny.toml" if arg.endswith(".toml") else arg for arg in command[1:]]
        result = runner.invoke(app, args, env={"JOB_COMPLETION_INDEX": str(index), "SPECBENCH_HOST": f"pod-{index}"})
        assert result.exit_code == 0, result.output
        shard = json.loads((tmp_path / "results" / f"tiny-shard{index + 1}of{count}" / "manifest.json").read_text())
        assert shard["shard"]["index"] == index + 1 and shard["shard"]["host"] == f"pod-{index}"

    script, merge_line = (block for block in _blocks("sh") if "specbench-sweep" in block or "$SWEEP_JOB" in block)
    low, high = map(int, re.search(r"#SBATCH --array=(\d+)-(\d+)", script).groups())
    command = shlex.split(next(line for line in script.splitlines() if line.startswith("srun ")))[1:]
    assert command[command.index("--shard") + 1] == f"auto/{high - low + 1}"
    for task in range(low, high + 1):
        args = ["tiny.toml" if arg.endswith(".toml") else arg for arg in command[1:]]
        result = runner.invoke(app, [*args, "--out", f"slurm/shard{task}"],
                               env={"SLURM_ARRAY_TASK_ID": str(task), "SLURM_ARRAY_TASK_MIN": str(low),
                                    "SPECBENCH_HOST": f"node-{task}"})
        assert result.exit_code == 0, result.output
    wrapped = shlex.split(re.search(r'--wrap "(.*)"', merge_line).group(1))
    assert wrapped[:2] == ["specbench", "merge"]
    folders = sorted(str(path) for path in (tmp_path / "slurm").iterdir())
    result = runner.invoke(app, ["merge", *folders, "--out", "merged"])
    assert result.exit_code == 0, result.output
    merged = pd.read_parquet(tmp_path / "merged" / "points.parquet")
    assert set(merged["host"]) == {f"node-{task}" for task in range(low, high + 1)}


def test_the_kubernetes_and_slurm_tune_examples_share_one_study_then_merge(tmp_path, models_dir, monkeypatch):
    """The shared-tune Indexed Job and job array from docs/scaleout.md: their command run as two copies would (a SQLite
    file in place of the PostgreSQL URL, the tiny models' profile), one study with exactly --trials finished trials,
    then the page's merge of the boxes' folders."""
    import optuna
    import yaml

    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, profile=tiny_profile(gamma=(2, 3), temperature=(0.0,), max_new_tokens=8, repeats=1,
                                                 warmup=0), prompts=PROMPTS, models=models_dir)
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    job = next(job for job in map(yaml.safe_load, _blocks("yaml")) if job["metadata"]["name"] == "specbench-tune")
    assert job["spec"]["completionMode"] == "Indexed"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:2] == ["sh", "-c"]
    assert container["env"][0]["name"] == "SPECBENCH_STORAGE"
    script, merge_line = (block for block in _blocks("sh") if "specbench-tune" in block or "$TUNE_JOB" in block)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))[len("srun "):]
    runner = CliRunner()
    for text, variable in ((container["command"][2], "JOB_COMPLETION_INDEX"), (srun, "SLURM_ARRAY_TASK_ID")):
        study = None
        for index in range(4):  # the array's four copies, one after the other (the later find the study done)
            expanded = text.replace('"$SPECBENCH_STORAGE"', storage).replace(f"${variable}", str(index))
            args = ["tiny.toml" if arg.endswith(".toml") else arg for arg in shlex.split(expanded)[1:]]
            assert args[0] == "tune" and "--storage" in args
            study, trials = args[args.index("--study") + 1] + f"-{variable}", int(args[args.index("--trials") + 1])
            args[args.index("--study") + 1] = study
            result = runner.invoke(app, args, env={"SPECBENCH_HOST": f"box-{index}"})
            assert result.exit_code in (0, 1), result.output  # 1: nothing recommended on the tiny models
        finished = [t for t in optuna.load_study(study_name=f"{study}-t0-p1", storage=storage).trials
                    if t.state.name in ("COMPLETE", "PRUNED")]
        assert len(finished) == min(trials, 8)  # the tiny space: (n-gram sizes 1-3, the draft model) x 2 gammas
        assert len({t.user_attrs["point_id"] for t in finished}) == len(finished)
    wrapped = shlex.split(re.search(r'--wrap "(.*)"', merge_line).group(1))
    assert wrapped[:2] == ["specbench", "merge"]
    result = runner.invoke(app, wrapped[1:])
    assert result.exit_code == 0, result.output
    merged = pd.read_parquet(tmp_path / "results" / "tune-merged" / "points.parquet")
    assert set(merged["host"]) == {f"box-{index}" for index in range(4)}


def test_capacity_searches_merge_with_each_hosts_baseline_named(shards, tmp_path):
    from specbench.capacity.document import read_capacity, write_capacity
    from test_capacity_document import document, entry

    folders = [Path(shutil.copytree(folder, tmp_path / folder.name)) for folder in shards[1]]
    write_capacity(document(entry("baseline", 1.0, 1.2), entry("ngram γ2", 1.5, 1.7)), folders[0])
    write_capacity(document(entry("baseline", 0.8, 1.0), entry("close γ2", 0.6, 0.8)), folders[1])
    result = CliRunner().invoke(app, ["merge", *map(str, folders), "--out", str(tmp_path / "merged")])
    assert result.exit_code == 0, result.output
    merged = {e.configuration: e for e in read_capacity(tmp_path / "merged" / "capacity.json").configurations}
    assert set(merged) == {"baseline @box-a", "baseline @box-b", "ngram γ2", "close γ2"}
    assert merged["ngram γ2"].gain_vs_baseline == pytest.approx(0.5)  # against box-a's baseline, as measured there
    assert merged["close γ2"].gain_vs_baseline == pytest.approx(-0.25)  # against box-b's


def test_tune_replays_a_shard_and_refuses_a_merge_of_several_hosts(shards, tmp_path):
    folders = [str(folder) for folder in shards[1]]
    runner = CliRunner()
    assert runner.invoke(app, ["merge", *folders, "--out", str(tmp_path / "merged")]).exit_code == 0
    result = runner.invoke(app, ["tune", "--replay", str(tmp_path / "merged"), "--trials", "2", "--out",
                                 str(tmp_path / "refused")])
    assert result.exit_code == 2 and "a merged folder of 2 hosts (box-a, box-b)" in result.output
    result = runner.invoke(app, ["tune", "--replay", folders[0], "--trials", "2", "--out", str(tmp_path / "tuned")])
    assert result.exit_code in (0, 1), result.output  # a shard's own folder replays (1: nothing recommended)
    assert (tmp_path / "tuned" / "recommendation.json").exists()


def test_a_shard_killed_mid_sweep_resumes_its_own_points_once(tmp_path, models_dir):
    import os
    import signal
    import subprocess
    import sys
    import time

    write_project(tmp_path, profile=tiny_profile(gamma=(1, 2, 3), temperature=(0.0, 0.8), max_new_tokens=16),
                  prompts=PROMPTS, models=models_dir)
    out = tmp_path / "results" / "tiny-shard2of2"
    command = [sys.executable, "-m", "specbench.cli", "run", "tiny.toml", "--shard", "2/2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        points = pd.read_parquet(out / "points.parquet") if (out / "points.parquet").exists() else None
        if points is not None and len(points) >= 2:
            break
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    planned = json.loads((out / "manifest.json").read_text())["shard"]["points"]
    assert 2 <= len(pd.read_parquet(out / "points.parquet")) < len(planned), "the kill should land mid-shard"
    rerun = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    points, requests = pd.read_parquet(out / "points.parquet"), pd.read_parquet(out / "requests.parquet")
    assert sorted(points["point_id"]) == sorted(planned) and (points["status"] == "ok").all()
    assert not requests.duplicated(["point_id", "request_id"]).any()
    assert (requests.groupby("point_id").size() == len(PROMPTS) * 2).all()
