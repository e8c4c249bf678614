"""`specbench run`: plan the points of a profile, run each against its baseline, record every request.

Files are rewritten atomically after every point, so a sweep killed at any moment resumes with each
point exactly once; a point that raises is recorded as failed and the sweep goes on.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import platform
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import pandas as pd
import torch
import transformers

import specbench
from specbench import devices, results
from specbench.engine import BaselineProposer, DraftModelProposer, NgramProposer, Proposer, Trace, generate
from specbench.engine.hf import hf_generate
from specbench.models import LoadedModel, ModelError, check_same_vocabulary, load_model
from specbench.profile import Profile, dump_profile
from specbench.results import PointSpec, baseline_point_id
from specbench.workloads import Prompt, encode_prompt, load_prompts, workload_fingerprint


class ResumeError(ValueError):
    """The output folder holds a run of another configuration."""


class SweepObserver(Protocol):
    def sweep_started(self, points: list[PointSpec], to_run: list[PointSpec]) -> None: ...
    def point_started(self, spec: PointSpec, n_requests: int) -> None: ...
    def request_done(self, spec: PointSpec) -> None: ...
    def point_finished(self, spec: PointSpec, row: dict[str, Any]) -> None: ...
    def message(self, text: str) -> None: ...


class _Silent:
    def sweep_started(self, points, to_run): pass
    def point_started(self, spec, n_requests): pass
    def request_done(self, spec): pass
    def point_finished(self, spec, row): pass
    def message(self, text): pass


@dataclass
class RunResult:
    out_dir: Path
    points: pd.DataFrame
    requests: pd.DataFrame
    manifest: dict[str, Any]
    ran: list[str] = field(default_factory=list)  # point ids run by this call (the others were resumed)

    @property
    def failed(self) -> int:
        return int((self.points["status"] == "failed").sum()) if len(self.points) else 0


def plan_points(profile: Profile) -> list[PointSpec]:
    """Per (top_p, temperature): the baseline first, then every draft x gamma. Greedy ignores top_p, so
    temperature 0 is planned once, with top_p 1."""
    points: list[PointSpec] = []
    groups = [(1.0 if t == 0 else p, t) for p in profile.sweep.top_p for t in profile.sweep.temperature]
    for top_p, temperature in dict.fromkeys(groups):
        points.append(PointSpec(baseline_point_id(temperature, top_p), "baseline", "baseline", None, temperature, top_p))
        for draft in profile.drafts:
            for gamma in profile.sweep.gamma:
                points.append(PointSpec(
                    point_id=f"{draft.name}-g{gamma}-t{temperature:g}-p{top_p:g}", method=draft.method,
                    draft=draft.name, gamma=gamma, temperature=temperature, top_p=top_p,
                    draft_model=draft.model, draft_quantize=draft.quantize,
                    ngram_min=draft.ngram_min if draft.method == "ngram" else None,
                    ngram_max=draft.ngram_max if draft.method == "ngram" else None,
                ))
    return points


def _hash(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class _Context:
    profile: Profile
    device: torch.device
    dtype: torch.dtype
    target: LoadedModel
    drafts: dict[str, LoadedModel | str]  # a draft's model, or why it could not be loaded
    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    eos_token_ids: tuple[int, ...]
    run_key: str


def run_sweep(profile: Profile, *, out_dir: Path, fresh: bool = False, observer: SweepObserver | None = None) -> RunResult:
    """Run (or resume) every point of `profile` into `out_dir`."""
    observer = observer or _Silent()
    ctx = prepare(profile, observer=observer)
    planned = plan_points(profile)
    files = RunFiles(out_dir)
    earlier = files.open(ctx, planned, fresh=fresh)
    specs = planned + earlier  # points of an earlier, wider sweep of the same run stay in the files
    to_run = [spec for spec in planned if files.recorded(spec, ctx) is None]
    observer.sweep_started(specs, to_run)

    ran: list[str] = []
    for spec in to_run:
        observer.point_started(spec, len(ctx.prompts) * profile.run.repeats)
        rows, error = evaluate_point(spec, ctx, observer=observer)
        points = files.record(spec, ctx, rows, error=error, order=planned)
        ran.append(spec.point_id)
        observer.point_finished(spec, points[points["point_id"] == spec.point_id].iloc[0].to_dict())

    points = files.record(None, ctx, [], order=planned)
    manifest = files.finish(points)
    requests = results.read_parquet(out_dir / results.REQUESTS_FILE)
    return RunResult(out_dir, points, requests if requests is not None else pd.DataFrame(), manifest, ran)


def prepare(profile: Profile, *, observer: SweepObserver | None = None) -> _Context:
    """Load the workload and every model once: the context any number of points are run with."""
    observer = observer or _Silent()
    device = devices.resolve_device(profile.device)
    dtype = devices.resolve_dtype(profile.dtype, device)
    prompts = load_prompts(profile.workload.prompts, max_prompts=profile.workload.max_prompts,
                           categories=profile.workload.categories)
    observer.message(f"loading target {profile.target.model}")
    target = load_model(profile.target.model, device=device, dtype=dtype, quantize=profile.target.quantize)
    drafts = _load_drafts(profile, target, device=device, dtype=dtype, observer=observer)
    prompt_ids = [encode_prompt(target.tokenizer, prompt) for prompt in prompts]
    run_key = _hash({
        "target": [target.identity, profile.target.quantize], "workload": workload_fingerprint(prompts),
        "max_new_tokens": profile.workload.max_new_tokens, "run": profile.run.model_dump(),
        "backend": profile.backend, "device": device.type, "dtype": str(dtype),
    })
    return _Context(profile, device, dtype, target, drafts, prompts, prompt_ids, _eos_ids(target), run_key)


def evaluate_point(spec: PointSpec, ctx: _Context, *, observer: SweepObserver | None = None,
                   after_prompt: Callable[[list[dict[str, Any]]], None] | None = None,
                   ) -> tuple[list[dict[str, Any]], str | None]:
    """Run one point: its request rows, or no rows and the one-line reason it failed. `after_prompt`
    sees the rows so far after each prompt's repeats; an exception it raises that is not an
    `Exception` (a pruned trial, an interrupt) stops the point and propagates."""
    hook = {"after_prompt": after_prompt} if after_prompt is not None else {}
    try:
        return _run_point(spec, ctx, observer=observer or _Silent(), **hook), None
    except Exception as error:  # noqa: BLE001 - a failed point is data, not a crash
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        return [], _one_line(error)


class RunFiles:
    """The run's files in `out_dir`, shared by every process that writes to the folder: each change
    re-reads requests.parquet and points.parquet under a file lock and rewrites them atomically, so
    concurrent workers keep each other's points and every point is written once."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        self.manifest_path = out_dir / results.MANIFEST_FILE

    @contextmanager
    def lock(self, name: str = "files") -> Iterator[None]:
        """An exclusive lock between the processes of this machine that share the folder."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.out_dir / f".{name}.lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def open(self, ctx: _Context, planned: list[PointSpec], *, fresh: bool) -> list[PointSpec]:
        """Check the folder holds this run (or nothing), drop what cannot be resumed, write the
        manifest; returns the specs of done points that `planned` no longer holds."""
        with self.lock():
            keys = {spec.point_id: point_key(spec, ctx) for spec in planned}
            requests, context, earlier = _resume(self.out_dir, ctx.run_key, keys, fresh=fresh)
            if not len(requests):
                (self.out_dir / results.REQUESTS_FILE).unlink(missing_ok=True)
            _write(self.out_dir, planned + earlier, requests, {}, context)
            started = _previous_start(self.manifest_path, fresh)
            results.write_json_atomic(_manifest(ctx, self.out_dir, started=started), self.manifest_path)
        return earlier

    def recorded(self, spec: PointSpec, ctx: _Context) -> pd.DataFrame | None:
        """The request rows of `spec` if the folder holds it done with the same configuration."""
        points = results.read_parquet(self.out_dir / results.POINTS_FILE)
        requests = results.read_parquet(self.out_dir / results.REQUESTS_FILE)
        if points is None or requests is None or not len(points):
            return None
        key = point_key(spec, ctx)
        done = points[(points["point_id"] == spec.point_id) & (points["status"] == "ok") & (points["point_key"] == key)]
        return requests[requests["point_key"] == key].reset_index(drop=True) if len(done) else None

    def record(self, spec: PointSpec | None, ctx: _Context, rows: list[dict[str, Any]], *, error: str | None = None,
               order: list[PointSpec] = ()) -> pd.DataFrame:
        """Add one point (its rows, or its failure) to the files, replacing an earlier record of it;
        points are listed in `order` first. Returns the points table as written."""
        with self.lock():
            specs, requests, failures, context = self._load()
            if spec is not None:
                if len(requests):
                    requests = requests[requests["point_id"] != spec.point_id]
                failures.pop(spec.point_id, None)
                if error is not None:
                    failures[spec.point_id] = error
                if rows:
                    requests = pd.concat([requests, pd.DataFrame(rows)], ignore_index=True) if len(requests) else pd.DataFrame(rows)
                context[spec.point_id] = _point_context(spec, ctx, point_key(spec, ctx))
                specs = [s for s in specs if s.point_id != spec.point_id] + [spec]
            ordered = [s for s in order if s.point_id in {x.point_id for x in specs}]
            specs = ordered + [s for s in specs if s.point_id not in {x.point_id for x in ordered}]
            return _write(self.out_dir, specs, requests.reset_index(drop=True), failures, context)

    def finish(self, points: pd.DataFrame) -> dict[str, Any]:
        """Mark the manifest finished; returns it."""
        with self.lock():
            manifest = json.loads(self.manifest_path.read_text())
            manifest["finished_at"] = _now()
            manifest["status"] = "failed points" if (points["status"] == "failed").any() else "complete"
            results.write_json_atomic(manifest, self.manifest_path)
        return manifest

    def _load(self):
        """specs, requests, failures and per-point context as the files hold them."""
        points = results.read_parquet(self.out_dir / results.POINTS_FILE)
        requests = results.read_parquet(self.out_dir / results.REQUESTS_FILE)
        if points is None or not len(points):
            return [], pd.DataFrame(), {}, {}
        spec_fields = list(PointSpec.__dataclass_fields__)
        specs = [PointSpec(**{k: _plain(v) for k, v in row.items()}) for row in points[spec_fields].to_dict("records")]
        failures = {row["point_id"]: row["error"] for row in points[points["status"] == "failed"].to_dict("records")}
        context = {row["point_id"]: {"backend": row["backend"], "target_model": row["target_model"],
                                     "weight_mb": _plain(row["weight_mb"]), "point_key": row["point_key"]}
                   for row in points.to_dict("records")}
        return specs, requests if requests is not None else pd.DataFrame(), failures, context


def _load_drafts(profile: Profile, target: LoadedModel, *, device, dtype, observer) -> dict[str, LoadedModel | str]:
    """Each draft model once (shared by drafts with the same model and quantize); a draft that cannot
    be loaded or does not share the target's vocabulary fails its own points only."""
    loaded: dict[tuple[str, str | None], LoadedModel | str] = {}
    drafts: dict[str, LoadedModel | str] = {}
    for draft in profile.drafts:
        if draft.method != "draft":
            continue
        key = (draft.model, draft.quantize)
        if key not in loaded:
            observer.message(f"loading draft {draft.name}: {draft.model}" + (f" ({draft.quantize})" if draft.quantize else ""))
            try:
                model = load_model(draft.model, device=device, dtype=dtype, quantize=draft.quantize)
                check_same_vocabulary(target.tokenizer, model.tokenizer, target_name=target.name, draft_name=draft.model)
                loaded[key] = model
            except (ModelError, OSError, ValueError, RuntimeError) as error:
                loaded[key] = _one_line(error)
        drafts[draft.name] = loaded[key]
    return drafts


def _eos_ids(target: LoadedModel) -> tuple[int, ...]:
    ids = {target.tokenizer.eos_token_id}
    configured = getattr(target.model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return tuple(sorted(i for i in ids if i is not None))


def point_key(spec: PointSpec, ctx: _Context) -> str:
    """What makes a point's measurements reusable: the run's configuration, the point, its draft's identity."""
    draft = ctx.drafts.get(spec.draft)
    identity = draft.identity if isinstance(draft, LoadedModel) else None
    return _hash({"run": ctx.run_key, "point": asdict(spec), "draft_identity": identity})


def _point_context(spec: PointSpec, ctx: _Context, key: str) -> dict[str, Any]:
    draft = ctx.drafts.get(spec.draft)
    weight = ctx.target.weight_bytes + (draft.weight_bytes if isinstance(draft, LoadedModel) else 0)
    return {"backend": ctx.profile.backend, "target_model": ctx.profile.target.model,
            "weight_mb": weight / 2**20, "point_key": key}


def _run_point(spec: PointSpec, ctx: _Context, *, observer: SweepObserver,
               after_prompt: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
    """Warm-up requests (not recorded), then every prompt x repeat."""
    generate_one = _request_function(spec, ctx)
    for i in range(ctx.profile.run.warmup):
        generate_one(ctx.prompt_ids[i % len(ctx.prompt_ids)], ctx.profile.run.seed)
    rows = []
    key = point_key(spec, ctx)
    for index, (prompt, ids) in enumerate(zip(ctx.prompts, ctx.prompt_ids)):
        for repeat in range(ctx.profile.run.repeats):
            seed = ctx.profile.run.seed + 1000 * index + repeat  # the same seeds at every point
            trace = generate_one(ids, seed)
            rows.append(results.request_row(spec, point_key=key, prompt_id=prompt.prompt_id, category=prompt.category,
                                            repeat=repeat, seed=seed, trace=trace))
            observer.request_done(spec)
        if after_prompt is not None:
            after_prompt(rows)
    return rows


def _request_function(spec: PointSpec, ctx: _Context) -> Callable[[list[int], int], Trace]:
    draft = ctx.drafts.get(spec.draft)
    if isinstance(draft, str):
        raise ModelError(draft)
    settings = dict(temperature=spec.temperature, top_p=spec.top_p, max_new_tokens=ctx.profile.workload.max_new_tokens,
                    eos_token_ids=ctx.eos_token_ids)
    gamma = spec.gamma or 1
    if ctx.profile.backend == "hf":
        return lambda ids, seed: hf_generate(ctx.target.model, ids, method=spec.method, gamma=gamma, seed=seed,
                                             draft=draft.model if draft else None, ngram_max=spec.ngram_max or 3,
                                             **settings)
    proposer = _proposer(spec, ctx, draft)
    return lambda ids, seed: generate(ctx.target.model, proposer, ids, gamma=gamma, seed=seed, **settings)


def _proposer(spec: PointSpec, ctx: _Context, draft: LoadedModel | None) -> Proposer:
    if spec.method == "baseline":
        return BaselineProposer(ctx.device)
    if spec.method == "ngram":
        return NgramProposer(ngram_min=spec.ngram_min, ngram_max=spec.ngram_max, device=ctx.device)
    vocab_size = ctx.target.model.get_output_embeddings().weight.shape[0]
    return DraftModelProposer(draft.model, vocab_size=vocab_size, device=ctx.device, name=spec.draft)


def _resume(out_dir: Path, run_key: str, keys: dict[str, str], *, fresh: bool):
    """What an earlier run in `out_dir` left: the requests of points done with the same configuration,
    their constant columns, and the specs of done points the profile no longer plans. Failed points,
    points whose draft changed, and requests of points that were not finished are dropped (rerun)."""
    empty = pd.DataFrame(), {}, []
    manifest_path = out_dir / results.MANIFEST_FILE
    if fresh or not manifest_path.exists():
        for name in (results.REQUESTS_FILE, results.POINTS_FILE):
            (out_dir / name).unlink(missing_ok=True)
        return empty
    previous = json.loads(manifest_path.read_text())
    if previous.get("run_key") != run_key:
        raise ResumeError(
            f"{out_dir}: holds a run of another target, workload or run settings; "
            "use --fresh to replace it or --out DIR to keep both"
        )
    points = results.read_parquet(out_dir / results.POINTS_FILE)
    requests = results.read_parquet(out_dir / results.REQUESTS_FILE)
    if points is None or requests is None or not len(points):
        return empty
    ok = points[points["status"] == "ok"]
    current = ok[ok["point_key"] == ok["point_id"].map(keys)]
    unplanned = ok[~ok["point_id"].isin(set(keys))]
    kept = pd.concat([current, unplanned])
    requests = requests[requests["point_key"].isin(set(kept["point_key"]))]
    context = {row["point_id"]: {"backend": row["backend"], "target_model": row["target_model"],
                                 "weight_mb": row["weight_mb"], "point_key": row["point_key"]}
               for row in kept.to_dict("records")}
    spec_fields = list(PointSpec.__dataclass_fields__)
    earlier = [PointSpec(**{k: _plain(v) for k, v in row.items()}) for row in unplanned[spec_fields].to_dict("records")]
    return requests.reset_index(drop=True), context, earlier


def _plain(value: Any) -> Any:
    """A parquet cell as a plain Python value (nullable ints come back as floats or NA)."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value


def _write(out_dir: Path, specs: list[PointSpec], requests: pd.DataFrame, failures: dict[str, str],
           context: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """requests first, then points: a point counts as done only once both hold it."""
    if len(requests):
        results.write_parquet_atomic(requests, out_dir / results.REQUESTS_FILE)
    points = results.summarize(specs, requests, failures=failures, context=context)
    results.write_parquet_atomic(points, out_dir / results.POINTS_FILE)
    return points


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:500]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _previous_start(manifest_path: Path, fresh: bool) -> str:
    if not fresh and manifest_path.exists():
        return json.loads(manifest_path.read_text()).get("started_at", _now())
    return _now()


def _manifest(ctx: _Context, out_dir: Path, *, started: str) -> dict[str, Any]:
    drafts = {name: ({"model": m.name, "identity": m.identity, "quantize": m.quantize, "weight_mb": m.weight_bytes / 2**20}
                     if isinstance(m, LoadedModel) else {"error": m}) for name, m in ctx.drafts.items()}
    return {
        "specbench_version": specbench.__version__,
        "run_key": ctx.run_key,
        "profile": json.loads(json.dumps(ctx.profile.model_dump(mode="json"))),
        "profile_toml": dump_profile(ctx.profile),
        "profile_path": str(ctx.profile.source) if ctx.profile.source else None,
        "models": {"target": {"model": ctx.target.name, "identity": ctx.target.identity,
                              "quantize": ctx.target.quantize, "weight_mb": ctx.target.weight_bytes / 2**20},
                   "drafts": drafts},
        "workload": {"prompts": ctx.profile.workload.prompts, "fingerprint": workload_fingerprint(ctx.prompts),
                     "prompt_ids": [p.prompt_id for p in ctx.prompts],
                     "prompt_tokens": [len(ids) for ids in ctx.prompt_ids]},
        "environment": _environment(ctx.device),
        "started_at": started,
        "finished_at": None,
        "status": "running",
    }


def _environment(device: torch.device) -> dict[str, Any]:
    return {
        "specbench": specbench.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(),
        "device": str(device), "device_name": devices.device_name(device),
        "accelerator": "gpu" if device.type == "cuda" else "cpu",
        "cuda": torch.version.cuda, "cpu_count": torch.get_num_threads(), "git_commit": _git_commit(),
    }


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
