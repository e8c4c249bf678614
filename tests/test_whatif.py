"""Acceptance what-ifs: imposed acceptance on the native decoder (what it keeps is what was imposed, within binomial
noise), the profile's `acceptance` and its bad input, synthetic points kept apart from real ones in every table, the
surface's fit, break-even and predictions from acceptance measured elsewhere."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.core import imposed, whatif
from specbench.core.stats import StepModel
from specbench.decoding.decode import generate
from specbench.decoding.proposers import DraftModelProposer, NgramProposer
from specbench.profile import profile_from_dict
from specbench.sweep.plan import plan_points
from tiny import DEVICE, perturbed, tiny_llama, tiny_profile, write_project

PROMPT = [5, 9, 13, 22, 5, 9, 40, 41, 42, 5, 9, 13, 7]


@pytest.fixture(scope="module")
def target():
    return tiny_llama()


def _kept_per_position(traces, gamma):
    """Per position: steps that drafted gamma and kept positions 0..i, over steps that drafted gamma."""
    full = [step for trace in traces for step in trace.steps if step.drafted == gamma]
    return len(full), [sum(step.accepted > i for step in full) / len(full) for i in range(gamma)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_native_keeps_what_was_imposed_within_binomial_noise(target, temperature):
    rates = (0.8, 0.5, 0.2)
    proposer = DraftModelProposer(perturbed(target, scale=0.5), vocab_size=target.config.vocab_size, device=DEVICE)
    traces = [generate(target, proposer, PROMPT, gamma=3, temperature=temperature, max_new_tokens=120, seed=seed,
                       imposed_acceptance=rates) for seed in range(6)]
    steps, kept = _kept_per_position(traces, 3)
    assert steps > 150
    for measured, rate in zip(kept, rates):
        assert abs(measured - rate) <= 4 * np.sqrt(rate * (1 - rate) / steps) + 1e-9, (kept, rates, steps)
    # a drafted token is kept whatever the target says: the output is no longer the target's
    assert all(step.emitted == step.accepted + 1 for trace in traces for step in trace.steps[:-1])


def test_native_imposed_on_a_lookup_applies_to_the_positions_it_drafted(target):
    traces = [generate(target, NgramProposer(ngram_min=1, ngram_max=2, device=DEVICE), PROMPT, gamma=2,
                       temperature=0.0, max_new_tokens=80, seed=seed, imposed_acceptance=(1.0, 1.0))
              for seed in range(2)]
    steps = [step for trace in traces for step in trace.steps]
    assert all(step.accepted == step.drafted for step in steps)  # rate 1: every drafted token kept, none invented
    assert any(step.drafted < 2 for step in steps)


def test_imposed_rates_that_decrease_and_lengths_that_become_geometric():
    assert imposed.rates_at((0.9, 0.6, 0.3), 2) == (0.9, 0.6)
    rates = imposed.rates_at(2.2, 3)
    assert StepModel((1.0,) * 3, rates).tokens_per_step() == pytest.approx(2.2, abs=1e-4)
    assert rates[1] == pytest.approx(rates[0] ** 2, abs=1e-5)
    assert imposed.entry_problem(4.5, 3, largest=3) is not None and imposed.entry_problem(4.0, 3, largest=3) is None
    assert imposed.entry_problem((0.9, 0.8), 1, largest=3) is not None


def _profile(acceptance, gamma=(1, 3), **extra) -> dict:
    return {"name": "w", "target": {"model": "someorg/target"},
            "drafts": [{"name": "ngram", "method": "ngram", "gamma": list(gamma), "acceptance": acceptance}],
            "sweep": {"gamma": [2], "temperature": [0.0]}, "workload": {"prompts": "builtin:mixed"}, **extra}


def test_the_plan_runs_each_acceptance_at_each_gamma_as_its_own_point():
    points = plan_points(profile_from_dict(_profile([[0.9, 0.7, 0.5], 1.8])))
    imposed_points = {p.point_id: p.imposed_acceptance for p in points if p.synthetic}
    assert imposed_points == {"ngram-g1-syn1-t0-p1": "0.9", "ngram-g1-syn2-t0-p1": "0.8",
                              "ngram-g3-syn1-t0-p1": "0.9,0.7,0.5",
                              "ngram-g3-syn2-t0-p1": imposed.as_text(imposed.rates_at(1.8, 3))}
    assert len({p.identity()["imposed_acceptance"] for p in points if p.synthetic}) == 4


@pytest.mark.parametrize("acceptance, extra, words", [
    ([[0.9, 1.2, 0.5]], {}, "[0, 1]"),
    ([[0.5, 0.7, 0.2]], {}, "must not increase"),
    ([[0.9, 0.7, 0.5, 0.4]], {}, "largest gamma 3"),
    ([4.5], {}, "more than gamma 1 can reach"),
    ([0.5], {}, ">= 1"),
    (["0.5"], {}, "list of per-position rates"),
    ([[0.9, 0.7, 0.5]], {"backend": "hf"}, 'backend "hf"'),
    ([[0.9, 0.7, 0.5]], {"backend": "server", "server": {"engine": "llama.cpp"}, "gamma": (3,)},
     "no synthetic acceptance"),
    (["measured", "measured"], {}, "twice"),
])
def test_bad_imposed_acceptance_is_one_line_naming_the_key(acceptance, extra, words):
    with pytest.raises(ValueError) as error:
        profile_from_dict(_profile(acceptance, **extra))
    message = str(error.value)
    assert "drafts[0].acceptance" in message and words in message and "\n" not in message


def test_vllm_launches_the_synthetic_sampler_with_the_points_rates():
    from specbench.engines.base import Speculation
    from specbench.engines.vllm import ENGINE
    args = ENGINE.speculation_args(Speculation("ngram", 3, None, 1, 3, imposed_acceptance=(0.9, 0.7, 0.5)),
                                   version="0.32.0")
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["rejection_sample_method"] == "synthetic"
    assert config["synthetic_acceptance_rates"] == [0.9, 0.7, 0.5]
    with pytest.raises(Exception, match="0.32 and later"):
        ENGINE.speculation_args(Speculation("ngram", 3, None, 1, 3, imposed_acceptance=(0.9, 0.7, 0.5)),
                                version="0.31.0")


# --- the surface -------------------------------------------------------------------------------------


def _surface(c=0.1, d=1.6, lengths=(1.3, 1.9, 2.6), gamma=3, sd=0.01, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for k, length in enumerate(lengths, 1):
        speedup = 1.0 / (c + d / length) * (1 + rng.normal(0, sd))
        rows.append({"point_id": f"ngram-g{gamma}-syn{k}-t0-p1", "status": "ok", "method": "ngram", "draft": "ngram",
                     "gamma": gamma, "temperature": 0.0, "top_p": 1.0, "concurrency": 1, "request_rate": np.nan,
                     "imposed_acceptance": "x", "mean_accepted_length": length, "speedup": speedup,
                     "speedup_ci_low": speedup * (1 - 2 * sd), "speedup_ci_high": speedup * (1 + 2 * sd),
                     "drafted_per_step": 3.0, "target_model": "t"})
    return pd.DataFrame(rows)


def test_break_even_finds_where_the_model_pays_with_an_interval_around_it():
    fits = whatif.fit_surface(_surface())
    (fit,) = fits.values()
    assert fit.c == pytest.approx(0.1, abs=0.05) and fit.d == pytest.approx(1.6, abs=0.1)
    found = whatif.break_even(fit, 3)
    assert found.verdict == "pays above"
    assert found.length == pytest.approx(1.6 / 0.9, rel=0.05)  # d / (1 - c)
    assert found.length_low < found.length < found.length_high
    assert StepModel.geometric(alpha=found.alpha, gamma=3).tokens_per_step() == pytest.approx(found.length, rel=1e-3)
    never = whatif.break_even(next(iter(whatif.fit_surface(_surface(c=0.3, d=3.5)).values())), 3)
    assert never.verdict == "never pays" and never.length is None


def _source(alpha=0.6, gamma=3, requests=40, steps=50, seed=1):
    """A real draft's requests with geometric acceptance at alpha, measured at `gamma`."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(requests):
        kept = np.minimum(rng.geometric(1 - alpha, size=steps) - 1, gamma)
        rows.append({"point_id": f"ngram-g{gamma}-t0-p1", "output_tokens": int(1 + (kept + 1).sum()),
                     "target_steps": steps, "accepted_tokens": int(kept.sum()),
                     "accepted_per_position": [int((kept > i).sum()) for i in range(gamma)],
                     "drafted_per_position": [steps] * gamma, "error": None})
    points = pd.DataFrame([{"point_id": f"ngram-g{gamma}-t0-p1", "status": "ok", "method": "ngram", "draft": "ngram",
                            "gamma": gamma, "temperature": 0.0, "top_p": 1.0, "concurrency": 1, "request_rate": np.nan,
                            "imposed_acceptance": None, "gamma_schedule": None, "target_model": "t"}])
    return points, pd.DataFrame(rows)


def test_a_prediction_from_measured_acceptance_lands_on_the_surface_with_an_interval():
    fits = whatif.fit_surface(_surface())
    points, requests = _source(alpha=0.6)
    (row,) = whatif.predictions(fits, whatif.source_acceptances(points, requests)).to_dict("records")
    length = 1 + 0.6 + 0.36 + 0.216
    assert row["source_mean_accepted_length"] == pytest.approx(length, rel=0.05)
    assert row["predicted_speedup"] == pytest.approx(1 / (0.1 + 1.6 / length), rel=0.05)
    assert row["predicted_speedup_ci_low"] < row["predicted_speedup"] < row["predicted_speedup_ci_high"]
    assert not row["extrapolated"]


def test_predictions_need_the_same_target_and_per_position_acceptance(tmp_path):
    from specbench.report.whatif import WhatIfError, whatif_report
    points, requests = _source()
    other = points.assign(target_model="another")
    with pytest.raises(WhatIfError, match="another"):
        whatif_report(_surface(), pd.DataFrame(), source=("elsewhere", other, requests))
    without = requests.assign(accepted_per_position=None, drafted_per_position=None)
    with pytest.raises(WhatIfError, match="per-position acceptance"):
        whatif_report(_surface(), pd.DataFrame(), source=("elsewhere", points, without))


# --- end to end on the native backend ---------------------------------------------------------------


PROMPTS = [("the cat sat on the mat and the dog ran fast", "chat"),
           ("write code to sum one two three four five", "code")]


def test_a_native_run_mixing_synthetic_and_real_points_keeps_them_apart(tmp_path, models_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    profile = tiny_profile(gamma=(2,), temperature=(0.0,), max_new_tokens=24, repeats=1, warmup=0).replace(
        'model = "./draft"\n', 'model = "./draft"\nacceptance = ["measured", [0.9, 0.6], [0.3, 0.1]]\n')
    write_project(tmp_path, profile=profile, prompts=PROMPTS, models=models_dir)
    result = CliRunner().invoke(app, ["run", "tiny.toml"])
    assert result.exit_code == 0, result.output
    points = pd.read_parquet(tmp_path / "results" / "tiny" / "points.parquet").set_index("point_id")
    synthetic = points[points["imposed_acceptance"].notna()]
    assert list(synthetic.index) == ["close-g2-syn1-t0-p1", "close-g2-syn2-t0-p1"]
    assert (synthetic["acceptance_source"] == "synthetic").all()
    assert synthetic["outputs_match_baseline"].isna().all()  # never compared: not lossless
    assert points.loc["close-g2-syn1-t0-p1", "mean_accepted_length"] > points.loc["close-g2-syn2-t0-p1",
                                                                                   "mean_accepted_length"]
    assert points.loc["close-g2-t0-p1", "outputs_match_baseline"]
    out = tmp_path / "report.json"
    result = CliRunner().invoke(app, ["report", "results/tiny", "--format", "json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert not any("-syn" in row["point_id"] for row in document["points"])  # the tables hold the real points only
    (what,) = document["whatif"]
    assert {row["point_id"] for row in what["surface"]} == set(synthetic.index)
    assert len(what["break_even"]) == 1
    (prediction,) = what["predictions"]  # the real draft's own acceptance on its surface, beside its measurement
    assert prediction["measured_point_id"] == "close-g2-t0-p1" and prediction["predicted_speedup"] > 0
    text = CliRunner().invoke(app, ["report", "results/tiny"]).output
    assert "Break-even acceptance" in text and "synthetic" in text
    html = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", "results/tiny", "--format", "html", "--out", str(html)])
    assert result.exit_code == 0 and "Speedup against acceptance (imposed)" in html.read_text()
    # bad input: a source folder with another target, exit 2, nothing written
    bad = tmp_path / "bad.json"
    other = tmp_path / "other"
    other.mkdir()
    for name in ("points.parquet", "requests.parquet"):
        frame = pd.read_parquet(tmp_path / "results" / "tiny" / name)
        if "target_model" in frame:
            frame["target_model"] = "someone/else"
        frame.to_parquet(other / name)
    result = CliRunner().invoke(app, ["report", "results/tiny", "--acceptance-from", str(other), "--format", "json",
                                      "--out", str(bad)])
    assert result.exit_code == 2 and "someone/else" in result.output and not bad.exists()
    real = tmp_path / "real"  # a surface without imposed points cannot predict
    real.mkdir()
    frame = pd.read_parquet(tmp_path / "results" / "tiny" / "points.parquet")
    frame[frame["imposed_acceptance"].isna()].to_parquet(real / "points.parquet")
    (real / "requests.parquet").write_bytes((tmp_path / "results" / "tiny" / "requests.parquet").read_bytes())
    result = CliRunner().invoke(app, ["report", str(real), "--acceptance-from", "results/tiny"])
    assert result.exit_code == 2 and "imposed acceptance" in result.output

    # a point that kept other than was imposed is unstable and says what it kept: its rows summarised as if 0.3, 0.1
    # had been imposed where 0.9, 0.6 was
    from specbench.core.results import PointSpec
    from specbench.core.summary import summarize
    requests = pd.read_parquet(tmp_path / "results" / "tiny" / "requests.parquet")
    specs = [PointSpec.from_row(row) for row in frame.to_dict("records")]
    specs = [replace(spec, imposed_acceptance="0.3,0.1") if spec.point_id == "close-g2-syn1-t0-p1" else spec
             for spec in specs]
    rows = summarize(specs, requests, failures={}, context={}).set_index("point_id")
    assert rows.loc["close-g2-syn1-t0-p1", "unstable"]
    assert "where 0.3 was imposed" in rows.loc["close-g2-syn1-t0-p1", "unstable_reason"]
    assert not rows.loc["close-g2-syn2-t0-p1", "unstable"]


def test_a_point_that_kept_other_than_what_was_imposed_is_said():
    assert imposed.kept_mismatch((0.8, 0.5), accepted=(160, 101), drafted=(200, 200)) is None
    wrong = imposed.kept_mismatch((0.8, 0.5), accepted=(190, 180), drafted=(200, 200))
    assert "0.95 at position 1 where 0.8 was imposed" in wrong and "0.90 at position 2" in wrong


def test_tune_refuses_an_imposed_acceptance_in_one_line(tmp_path, models_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)
    profile = tiny_profile(gamma=(2,), temperature=(0.0,)).replace(
        'model = "./draft"\n', 'model = "./draft"\nacceptance = [[0.9, 0.6]]\n')
    write_project(tmp_path, profile=profile, prompts=PROMPTS, models=models_dir)
    result = CliRunner().invoke(app, ["tune", "tiny.toml", "--trials", "2"])
    assert result.exit_code == 2 and "drafts[1].acceptance: tune searches real drafts" in result.output
    assert "\n" not in result.output.strip() and not (tmp_path / "results").exists()


def test_a_source_that_drafts_fewer_per_pass_is_priced_at_its_own_proposals():
    """An n-gram lookup drafts fewer tokens where nothing matches, and an imposed acceptance changes what it later
    finds: the surface measured at ~2 drafted per pass prices a real lookup that drafts 1.4 by its own count."""
    c, a, b = 0.15, 0.7, 0.25
    rows = []
    for gamma, drafted in ((1, 0.7), (2, 1.35), (3, 2.0)):
        for k, length in enumerate((1.15, 1.4, 1.7, 2.1)[: gamma + 2], 1):
            speedup = 1 / (c + (a + b * drafted) / length)
            rows.append({"point_id": f"ngram-g{gamma}-syn{k}", "status": "ok", "method": "ngram", "draft": "ngram",
                         "gamma": gamma, "temperature": 0.0, "top_p": 1.0, "concurrency": 1, "request_rate": np.nan,
                         "imposed_acceptance": "x", "mean_accepted_length": length, "speedup": speedup,
                         "speedup_ci_low": speedup * 0.99, "speedup_ci_high": speedup * 1.01,
                         "drafted_per_step": drafted, "target_model": "t"})
    fit = whatif.fit_surface(pd.DataFrame(rows))[("ngram", "ngram", 3, 0.0, 1.0, 1, None)]
    assert fit.per_drafted == pytest.approx(b, rel=0.05)
    truth = 1 / (c + (a + b * 1.4) / 1.5)
    assert fit.speedup(1.5, 1.4) == pytest.approx(truth, rel=0.01)
    assert abs(fit.speedup(1.5) / truth - 1) > 0.05  # priced at the surface's own proposals it would be off


def test_a_capacity_search_of_an_imposed_acceptance_is_a_configuration_of_its_own():
    from specbench.sweep.capacity import configuration_label
    spec = next(p for p in plan_points(profile_from_dict(_profile([[0.9, 0.7, 0.5]]))) if p.synthetic and p.gamma == 3)
    assert configuration_label(spec) == "ngram γ3 imposed 0.9,0.7,0.5"
    assert configuration_label(replace(spec, imposed_acceptance=None)) == "ngram γ3"
