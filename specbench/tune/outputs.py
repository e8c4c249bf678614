"""What `specbench tune` leaves in the output folder: trials.parquet (one row per trial of every
study), recommendation.json (the choice per temperature and how to deploy it) and recommendation.toml
(a profile that `specbench run` reproduces the recommended points with, against their baselines)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import optuna
import pandas as pd

from specbench.capacity.sentence import percent_change
from specbench.tune.document import Recommendation, write_recommendation
from specbench.core import results
from specbench.profile import dump_profile, profile_from_dict
from specbench.scaleout.storage import masked
from specbench.tune.plan import RECOMMENDATION_TOML, TRIALS_FILE, Plan, TuneResult
from specbench.engines import ENGINES
from specbench.tune.load import max_num_seqs, mix_value
from specbench.tune.load import recommend as load_recommend
from specbench.tune.recommend import (
    choose, engine_settings, hub_reference, llama_cpp_binary, read_help, speculation_of,
)
from specbench.tune.capacity import BASELINE_ATTR as CAPACITY_BASELINE
from specbench.tune.capacity import capacity_recommendation
from specbench.tune.shared import of_host
from specbench.tune.space import SearchSpace

_TRIAL_COLUMNS = [
    "study", "number", "state", "role", "point_id", "draft", "gamma", "ngram_max", "temperature", "top_p",
    "value", "values", "noise", "repeat_values", "feasible", "constraint_values", "evaluated", "predicted_speedup",
    "warm_start_prediction", "prompts_measured", "sampled_point_id", "sampled_held_by", "duplicate_of", "trial_error",
    "worker", "datetime_start", "datetime_complete", "level_values",
]


def trial_rows(study: optuna.Study, *, space: SearchSpace, temperature: float, top_p: float) -> list[dict[str, Any]]:
    predictions = {tuple(sorted(p.items())): v for p, v in study.user_attrs.get("warm_start", {}).get("predictions", [])}
    rows = []
    for trial in study.get_trials(deepcopy=False):
        attrs, metrics = trial.user_attrs, trial.user_attrs.get("metrics") or {}
        values = list(trial.values) if trial.values is not None else None
        intermediate = trial.intermediate_values
        row = {
            "study": study.study_name, "number": trial.number, "state": trial.state.name,
            "role": attrs.get("role"), "point_id": attrs.get("point_id"),
            "draft": trial.params.get("draft"), "gamma": trial.params.get("gamma"),
            "ngram_max": trial.params.get("ngram_max", metrics.get("ngram_max")),
            "temperature": temperature, "top_p": top_p,
            "value": values[0] if values else (intermediate[max(intermediate)] if intermediate else None),
            "values": values, "noise": attrs.get("noise"), "repeat_values": attrs.get("repeat_values"),
            "feasible": all(v <= 0 for v in attrs.get("constraints", [])) if "metrics" in attrs else None,
            "constraint_values": attrs.get("constraints"), "evaluated": attrs.get("evaluated"),
            "predicted_speedup": metrics.get("predicted_speedup"),  # from the trial's own measurements
            "warm_start_prediction": predictions.get(tuple(sorted(trial.params.items()))),  # from the calibration
            "prompts_measured": max(intermediate) if intermediate else None,
            # what TPE proposed when the trial ran the untried configuration nearest to it instead
            "sampled_point_id": space.point(space.config(attrs["sampled"]), temperature=temperature,
                                            top_p=top_p).point_id if "sampled" in attrs else None,
            "sampled_held_by": attrs.get("sampled_held_by"),
            "duplicate_of": attrs.get("duplicate_of"), "trial_error": attrs.get("error"), "worker": attrs.get("worker"),
            # several load levels: the objective at each (the value is their mix); `levels` is each level's figures
            "level_values": [level["value"] for level in attrs["levels"]] if attrs.get("levels") else None,
            "levels": attrs.get("levels"), "capacity": attrs.get("capacity"),  # --objective capacity: the search
            "datetime_start": trial.datetime_start, "datetime_complete": trial.datetime_complete,
        }
        for column in results.POINT_COLUMNS:
            row.setdefault(column, metrics.get(column))
        rows.append(row)
    return rows


def trials_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    columns = _TRIAL_COLUMNS + [c for c in results.POINT_COLUMNS if c not in _TRIAL_COLUMNS]
    frame = pd.DataFrame(rows, columns=columns)
    dtypes = {k: v for k, v in results.POINT_DTYPES.items() if k in frame.columns}
    dtypes.update({"number": "Int64", "gamma": "Int64", "ngram_max": "Int64", "value": "float64", "noise": "float64",
                   "prompts_measured": "Int64", "sampled_held_by": "Int64",
                   "duplicate_of": "Int64", "sampled_point_id": "string", "feasible": "boolean", "evaluated": "boolean",
                   "predicted_speedup": "float64", "warm_start_prediction": "float64", "study": "string",
                   "state": "string", "role": "string", "trial_error": "string", "worker": "string"})
    return frame.astype(dtypes)


def write(plan: Plan, studies: dict[str, optuna.Study]) -> TuneResult:
    all_rows, choices = [], []
    binary = llama_cpp_binary(plan.profile)
    engines = {"llama_cpp_binary": binary, "llama_cpp_help": read_help(binary)}  # its flag names, where it is known
    for group in plan.groups:
        study = studies[group.study]
        rows = trial_rows(study, space=plan.space, temperature=group.temperature, top_p=group.top_p)
        all_rows += rows
        choices.append(_recommendation(plan, group, rows, engines=engines,
                                       attrs=study.user_attrs))
    recommendation = Recommendation(
        objective={"name": plan.settings.objective.name, "columns": list(plan.settings.objective.columns),
                   "directions": list(plan.settings.objective.directions)},
        constraints={"max_peak_memory_mb": plan.settings.constraints.max_peak_memory_mb,
                     "min_acceptance_rate": plan.settings.constraints.min_acceptance_rate},
        tolerance=plan.settings.tolerance, seed=plan.settings.seed, storage=masked(plan.storage_url),
        # the analytic warm start: how many predicted-best configurations follow the calibration, or why none
        warm_start={"configurations": plan.settings.warm_start, "available": plan.warm_start_unavailable is None,
                    "reason": plan.warm_start_unavailable},
        replay=str(plan.replay) if plan.replay else None, profile=plan.profile.name,
        target=plan.profile.target.model, search_space=plan.space.describe(),
        space_size=len(plan.space.configs()), temperatures=choices,
        load_levels=[level.as_dict() for level in plan.levels] if len(plan.levels) > 1 else None,
    )
    profile_toml = recommendation_profile(plan, choices)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    frame = trials_frame(all_rows)
    results.write_parquet_atomic(frame, plan.out_dir / TRIALS_FILE)
    write_recommendation(recommendation, plan.out_dir)
    (plan.out_dir / RECOMMENDATION_TOML).write_text(profile_toml)
    return TuneResult(plan.out_dir, frame, recommendation, profile_toml)


def _recommendation(plan: Plan, group, rows: list[dict[str, Any]], *, engines: dict[str, Any],
                    attrs: dict[str, Any]) -> dict[str, Any]:
    """The choice of one study; the baselines it is compared with are those the chosen trial's own box measured."""
    objective = plan.settings.objective
    finished = [r for r in rows if r["state"] in ("COMPLETE", "PRUNED")]
    evaluated = {r["point_id"] for r in rows if r["evaluated"]}
    held = {r["point_id"] for r in rows if r["state"] in ("COMPLETE", "PRUNED") or r["trial_error"] is not None}
    chosen, front = choose(rows, objective=objective, tolerance=plan.settings.tolerance)
    worker = chosen["worker"] if chosen is not None else None
    baselines = of_host(attrs, "load_baselines", worker)
    capacity_baseline = of_host(attrs, CAPACITY_BASELINE, worker)
    if len(plan.levels) > 1:
        return _load_recommendation(plan, group, rows, chosen, engines=engines, baselines=baselines or [],
                                    counts={"trials": len(finished), "evaluations": len(evaluated),
                                            "space_exhausted": len(held) >= len(plan.space.configs())})
    capacity = capacity_recommendation(chosen, capacity_baseline, usd_per_hour=plan.profile.usd_per_replica_hour,
                                       traffic_rps=plan.profile.cost.traffic_rps)
    speculate = chosen is not None and (capacity["measurably_higher"] if capacity else _measurably_faster(chosen))
    entry: dict[str, Any] = {
        "temperature": group.temperature, "top_p": group.top_p, "study": group.study,
        "trials": len(finished), "evaluations": len(evaluated),
        "space_exhausted": len(held) >= len(plan.space.configs()),  # every configuration has a trial: none left
        "speculate": speculate,
    }
    if chosen is None:
        entry["reason"] = "no completed trial satisfies the constraints"
        entry["engine_settings"] = engine_settings(None, target=plan.profile.target.model,
                                                   temperature=group.temperature, top_p=group.top_p, **engines)
        return entry
    entry.update({
        "trial": chosen["number"], "point_id": chosen["point_id"], "method": chosen["method"], "draft": chosen["draft"],
        "draft_model": chosen["draft_model"], "draft_quantize": chosen["draft_quantize"], "gamma": chosen["gamma"],
        "ngram_min": chosen["ngram_min"], "ngram_max": chosen["ngram_max"],
        "objective_value": chosen["value"], "objective_values": chosen["values"], "noise": chosen["noise"],
        "speedup": chosen["speedup"], "speedup_ci": [chosen["speedup_ci_low"], chosen["speedup_ci_high"]],
        "predicted_speedup": chosen["predicted_speedup"], "warm_start_prediction": chosen["warm_start_prediction"],
        "tokens_per_s": chosen["tokens_per_s"],
        "acceptance_rate": chosen["acceptance_rate"], "mean_accepted_length": chosen["mean_accepted_length"],
        "peak_memory_mb": chosen["peak_memory_mb"], "tpot_ms_p50": chosen["tpot_ms_p50"],
        "reason": ("the best objective, or the smallest gamma within the noise of the best" if speculate else
                   f"the best configuration ({chosen['point_id']}) does not hold the SLO at measurably more requests/s "
                   f"than the baseline ({_capacity_gain(capacity)})" if capacity else
                   f"the best configuration ({chosen['point_id']}) is not measurably faster than the baseline "
                   f"(speedup {_ratio(chosen['speedup'])}, 95% CI {_ratio(chosen['speedup_ci_low'])}-"
                   f"{_ratio(chosen['speedup_ci_high'])})"),
        # at capacity where a search ran (a replica serving at the rate it holds), else at the point's throughput
        "usd_per_mtok": capacity["usd_per_mtok_at_capacity"] if capacity else chosen.get("usd_per_mtok"),
        **({"capacity": capacity} if capacity else {}),
    })
    if front:
        entry["pareto_front"] = [{k: r[k] for k in ("number", "point_id", "gamma", "tokens_per_s", "peak_memory_mb",
                                                    "speedup")} for r in front]
    entry["engine_settings"] = engine_settings(chosen if speculate else None, target=plan.profile.target.model,
                                               temperature=group.temperature, top_p=group.top_p, **engines)
    return entry


def _load_recommendation(plan: Plan, group, rows: list[dict[str, Any]], chosen: dict[str, Any] | None, *,
                         engines: dict[str, Any], baselines: list[dict[str, Any]], counts: dict[str, Any]) -> dict[str, Any]:
    """Several load levels: the single setting best over the load mix (`chosen`), and `load` (see
    specbench.tune.load): per level, the crossover, the gamma schedule. Speculation is recommended when the single
    setting beats the baseline over the mix, or the schedule drafts at some level."""
    objective, target = plan.settings.objective, plan.profile.target.model
    baseline_mix = mix_value([b.get("value") for b in baselines], plan.levels) if baselines else None
    sign = 1 if objective.directions[0] == "maximize" else -1
    single = chosen if chosen is not None and (baseline_mix is None or sign * (chosen["value"] - baseline_mix) > 0) else None

    def speculative_config(row: dict[str, Any], ranges) -> dict[str, Any]:
        speculation = speculation_of(row, hub_reference)
        return ENGINES["vllm"].speculative_config(replace(speculation, gamma=max(g for _, _, g in ranges),
                                                          gamma_schedule=tuple(ranges)))

    load = load_recommend(rows, levels=plan.levels, baselines=baselines or [{}] * len(plan.levels), objective=objective,
                          tolerance=plan.settings.tolerance, single=single, max_batch=max_num_seqs(plan.profile),
                          speculative_config=speculative_config)
    schedule = load["schedule"]
    if schedule is not None and single is not None and schedule["uniform"] and schedule["draft"] == single["draft"] \
            and schedule["ngram_max"] == _int(single.get("ngram_max")) and schedule["gammas"][0]["gamma"] == single["gamma"]:
        schedule["same_as_single"] = True  # one gamma everywhere, the single setting's: nothing else to launch
        schedule["speculative_config"] = ENGINES["vllm"].speculative_config(speculation_of(single, hub_reference))
    entry: dict[str, Any] = {
        "temperature": group.temperature, "top_p": group.top_p, "study": group.study, **counts,
        "speculate": single is not None or schedule is not None, "baseline_mix_value": baseline_mix,
    }
    if single is not None:
        entry.update({"trial": single["number"], "point_id": single["point_id"], "method": single["method"],
                      "draft": single["draft"], "draft_model": single["draft_model"],
                      "draft_quantize": single["draft_quantize"], "gamma": single["gamma"],
                      "ngram_min": single["ngram_min"], "ngram_max": single["ngram_max"],
                      "objective_value": single["value"], "level_values": single["level_values"]})
    entry["reason"] = (
        f"over the load mix, {single['point_id']} is the best single setting ({objective.name} {single['value']:.4g} "
        f"against the baseline's {baseline_mix:.4g})" if single is not None and baseline_mix is not None else
        "no single setting beats the baseline over the load mix" if chosen is not None else
        "no completed trial satisfies the constraints")
    settings = engine_settings(single, target=target, temperature=group.temperature, top_p=group.top_p, **engines)
    if schedule is not None and not schedule.get("same_as_single"):
        variant = next(r for r in rows if r.get("levels") and r["draft"] == schedule["draft"]
                       and _int(r.get("ngram_max")) == schedule["ngram_max"])
        scheduled = engine_settings(variant,
                                    target=target, temperature=group.temperature, top_p=group.top_p,
                                    gamma_schedule=tuple(tuple(r) for r in schedule["batch_size_ranges"]), **engines)
        # recommended unless the verification measures it worse than the single setting (specbench.tune.verify)
        settings["vllm_single"], settings["vllm"] = settings["vllm"], scheduled["vllm"]
        settings["notes"].append("vLLM: a gamma per batch size (num_speculative_tokens_per_batch_size), tuned per "
                                 "concurrency level; the other engines have no such setting and get the single "
                                 "setting best over the load mix")
    entry["engine_settings"] = settings
    entry["load"] = load
    return entry


def _int(value: Any) -> int | None:
    return None if value is None or value != value else int(value)


def _measurably_faster(row: dict[str, Any]) -> bool:
    """Speculate only when the baseline is outside the speedup's 95 % CI (or, without a CI, when the
    speedup alone is above 1)."""
    low, speedup = row.get("speedup_ci_low"), row.get("speedup")
    if low is not None and low == low:  # not NaN
        return low > 1.0
    return speedup is None or speedup > 1.0


def _ratio(value: Any) -> str:
    return "-" if value is None or value != value else f"{value:.2f}x"


def recommendation_profile(plan: Plan, choices: list[dict[str, Any]]) -> str:
    """The tuned profile narrowed to the recommended drafts, gammas and temperatures, at the profile's load levels;
    under load, the gamma schedule too (a draft with its gamma_schedule), so that `specbench run` launches exactly
    what is recommended beside the single setting and the baseline. When temperatures recommend different points,
    `specbench run` runs their combinations too (a profile is a grid)."""
    data = profile_from_dict_data(plan)
    drafts, gammas = {}, []
    for choice in choices:
        names: dict[str, str] = {}
        if choice.get("point_id") is not None and choice.get("speculate"):
            draft = _tuned_draft(data, plan.space, choice["draft"], choice.get("ngram_max"))
            drafts[draft["name"]] = draft
            gammas.append(int(choice["gamma"]))
            names["single"] = draft["name"]
        schedule = (choice.get("load") or {}).get("schedule")
        if schedule is not None and not schedule.get("same_as_single"):
            draft = _tuned_draft(data, plan.space, schedule["draft"], schedule["ngram_max"])
            draft["name"] = f"{draft['name']}-dynamic"
            draft["gamma_schedule"] = schedule["batch_size_ranges"]
            drafts[draft["name"]] = draft
            names["schedule"] = draft["name"]
        if choice.get("load") is not None:
            choice["load"]["profile_drafts"] = names
    data["name"] = f"{plan.profile.name}-recommended"
    data["drafts"] = list(drafts.values())
    sweep = {"gamma": sorted(set(gammas)) or [1],
             "temperature": list(dict.fromkeys(c["temperature"] for c in choices)),
             "top_p": list(dict.fromkeys(c["top_p"] for c in choices))}
    for axis in ("concurrency", "request_rate"):  # measured at the load levels it was tuned at
        if axis in data["sweep"]:
            sweep[axis] = data["sweep"][axis]
    data["sweep"] = sweep
    profile = profile_from_dict(data)
    header = [f"# specbench tune: objective {plan.settings.objective.name}; recommended per temperature:"]
    for choice in choices:
        what = choice.get("point_id") if choice.get("speculate") and choice.get("point_id") else "no speculation (the baseline)"
        header.append(f"#   temperature {choice['temperature']:g}, top_p {choice['top_p']:g}: {what}")
        schedule = (choice.get("load") or {}).get("schedule")
        if schedule is not None:
            steps = ", ".join(f"{g['load']}: gamma {g['gamma']}" for g in schedule["gammas"])
            header.append(f"#     gamma per concurrency ({schedule['draft']}): {steps}; vLLM batch sizes "
                          f"{schedule['batch_size_ranges']}")
    return "\n".join(header) + "\n" + dump_profile(profile)


def _tuned_draft(data: dict[str, Any], space: SearchSpace, name: str, ngram_max: Any) -> dict[str, Any]:
    """The profile's draft `name` with the chosen n-gram length, named as the search named it (`<name>-n<length>`
    where the length was tuned), so that its points keep their ids."""
    draft = dict(next(d for d in data["drafts"] if d["name"] == name))
    choice = space.draft(name)  # a length not tuned stays as the profile wrote it (SGLang refuses one written)
    if draft["method"] == "ngram" and ngram_max is not None and ngram_max == ngram_max \
            and choice.ngram_max_low != choice.ngram_max_high:
        draft["ngram_max"] = int(ngram_max)
        draft["name"] = f"{name}-n{draft['ngram_max']}"
    return draft


def profile_from_dict_data(plan: Plan) -> dict[str, Any]:
    """The tuned profile as TOML-shaped data (no None values, no keys a draft's method ignores)."""
    import tomllib

    return tomllib.loads(dump_profile(plan.profile))


def _capacity_gain(capacity: dict[str, Any]) -> str:
    """`capacity 1.4 [1.3, 1.5] against 1.3 [1.2, 1.4] requests/s: gain +8 % [-4 %, +21 %]`."""
    def value(centre, interval) -> str:
        ends = ", ".join("-" if v is None else f"{v:.3g}" for v in (interval or [None, None]))
        return ("-" if centre is None else f"{centre:.3g}") + f" [{ends}]"

    gain = capacity.get("gain_interval") or [None, None]
    return (f"capacity {value(capacity['capacity_rps'], capacity.get('interval'))} against "
            f"{value(capacity['baseline_capacity_rps'], capacity.get('baseline_interval'))} requests/s: gain "
            f"{percent_change(capacity['gain_vs_baseline'])} [{percent_change(gain[0])}, {percent_change(gain[1])}]")
