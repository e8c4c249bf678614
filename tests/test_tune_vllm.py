"""`specbench tune` under load against a real vLLM (its CPU build, made by `make engine-vllm`; skipped where it is
not installed): n-gram gamma 1-2 tuned over concurrency 1 and 4 on the embedded SmolLM2, then the recommendation
verified: vLLM launched with exactly the exported settings (the gamma schedule as its
num_speculative_tokens_per_batch_size) and measured at both levels beside the best single setting and the baseline.
The schedule must be no worse than the best single setting at either level beyond the CI of their ratio.

vLLM runs with --enforce-eager here: it starts in ~35 s instead of ~95 s (torch.compile), for 6 launches (3 to tune,
3 to verify)."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from test_server_vllm import needs_vllm, vllm_pids, vllm_server

PROFILE = f"""
name = "vllm-load-tiny"
{vllm_server()}[[drafts]]
name = "ngram"
method = "ngram"
ngram_min = 2
ngram_max = 2
[sweep]
gamma = [1, 2]
temperature = [0.0]
concurrency = [1, 4]
[workload]
prompts = "copy.jsonl"
max_prompts = 6
max_new_tokens = 16
[run]
repeats = 1
warmup = 1
"""


# Prompts the target answers by copying: n-gram lookup then drafts what the target says, so speculation pays by
# a wide margin at both levels whatever else runs on the machine, and the recommendation has a draft to verify (on
# builtin:mixed, beside the other test worker, it paid at neither level once and there was nothing to verify).
PASSAGES = [
    "The Harbor Line ferry runs every 30 minutes between 6:00 and 22:00 on weekdays. On weekends, the first departure "
    "is at 8:00. Bicycles are allowed on all ferries for a fee of 2 euros.",
    "To reset the router, hold the small button on the back for ten seconds until the light turns orange, then wait "
    "two minutes before you connect again. Your settings are kept.",
    "The library opens at nine in the morning and closes at six in the evening. Books can be borrowed for three weeks "
    "and renewed twice online or at the front desk.",
    "Water the tomato plants every morning, keep them in full sun, and tie the stems to a stake once they are thirty "
    "centimetres tall. Pick the fruit when it is deep red.",
    "Our office moves to 14 Station Road on the first of March. The phone numbers stay the same, and parking is free "
    "behind the building for visitors.",
    "Each team member presents for five minutes on Friday: what was done this week, what is blocked, and what comes "
    "next. Questions wait until everyone has spoken.",
]


def write_profile(folder, text: str, name: str) -> None:
    (folder / name).write_text(text)
    (folder / "copy.jsonl").write_text("".join(json.dumps({
        "id": f"copy-{i}", "category": "copy", "messages": [{"role": "user", "content":
            f"Repeat the following text exactly, word for word, and write nothing else.\n\n{passage}"}]}) + "\n"
        for i, passage in enumerate(PASSAGES)))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vllm-tune")
    write_profile(folder, PROFILE, "load.toml")
    before = vllm_pids()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", "tune", "load.toml", "--trials", "2", "--out", "out"],
                            cwd=folder, capture_output=True, text=True, timeout=2400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = folder / "out"
    recommendation = json.loads((out / "recommendation.json").read_text())
    return recommendation, out, before, result.stdout + result.stderr


@needs_vllm
def test_every_configuration_is_measured_at_both_levels_with_one_launch_each(tuned):
    recommendation, out, _, _ = tuned
    assert [level["load"] for level in recommendation["load_levels"]] == ["concurrency 1", "concurrency 4"]
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 2 and (trials["state"] == "COMPLETE").all()
    assert all(len(values) == 2 for values in trials["level_values"])
    (choice,) = recommendation["temperatures"]
    assert choice["evaluations"] == 2 and recommendation["space_size"] == 2
    launches = json.loads((out / "manifest.json").read_text())["server"]["launches"]
    assert len(launches) == 3  # the baseline and one per gamma, each serving both levels


@needs_vllm
def test_the_exported_settings_are_what_the_verification_launched_and_measured(tuned):
    recommendation, out, before, output = tuned
    (choice,) = recommendation["temperatures"]
    load = choice["load"]
    assert [g["concurrency"] for g in (load["schedule"] or {"gammas": [{"concurrency": 1}, {"concurrency": 4}]})["gammas"]] == [1, 4]
    verification = load["verification"]
    assert verification["status"] == "measured", verification
    manifest = json.loads((out / "verify" / "manifest.json").read_text())
    configs = [json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None
               for argv in (launch["argv"] for launch in manifest["server"]["launches"])]
    vllm = choice["engine_settings"]["vllm"]
    exported = json.loads(vllm["args"][vllm["args"].index("--speculative-config") + 1]) if "args" in vllm else None
    assert exported in configs  # launched exactly as exported, the schedule included
    assert None in configs  # the baseline beside it
    schedule = load["schedule"]
    for level in verification["levels"]:
        assert level["baseline"] is not None and level["baseline"]["tokens_per_s"] > 0, level
        if choice.get("point_id") is not None:
            assert level["single"] is not None and level["single"]["speedup"] > 0, level
    if schedule is not None and not schedule.get("same_as_single"):
        assert schedule["batch_size_ranges"][0][0] == 1 and schedule["batch_size_ranges"][-1][1] == 4
        scheduled = vllm if schedule["recommended"] else choice["engine_settings"]["vllm_schedule"]
        launched = json.loads(scheduled["args"][scheduled["args"].index("--speculative-config") + 1])
        assert launched in configs  # the schedule was launched exactly as exported
        assert launched["num_speculative_tokens_per_batch_size"] == schedule["batch_size_ranges"]
        worse = [level["load"] for level in verification["levels"]
                 if level["single"] is not None and level["schedule_vs_single"]["worse"]]
        # what vLLM is told to run is no worse than the best single setting at any level beyond the CI of their
        # ratio: the schedule where it measured so, else the single setting (vLLM 0.32 CPU's dynamic speculation
        # path measured 0.82x the same gamma at concurrency 1 here)
        assert schedule["recommended"] == (not worse), verification
        if worse:
            assert "num_speculative_tokens_per_batch_size" not in exported  # the single setting, as verified
            assert ", ".join(worse) in verification["fallback"]
        else:
            assert exported == launched
            assert verification["schedule_no_worse"] is (True if choice.get("point_id") is not None else None)
    print(json.dumps({"levels": load["levels"], "schedule": schedule, "verification": verification}, indent=1))
    assert vllm_pids() <= before  # every launch of the tune and of the verification is gone
    assert "verifying the recommendation" in output
