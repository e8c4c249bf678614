"""specbench: benchmark and tune speculative decoding."""

__version__ = "0.1.0"


def run(profile, *, out=None, fresh: bool = False, backend: str | None = None, device: str | None = None,
        max_prompts: int | None = None, workers: int = 1, shard: str | None = None, observer=None):
    """Run a profile (a path or a loaded `Profile`) like `specbench run`, with the same options; returns a
    `RunResult` with `points` and `requests` DataFrames and the output folder. For notebooks and scripts."""
    from pathlib import Path

    from specbench.profile import Profile, load_profile, with_overrides
    from specbench.sweep import run_profile
    from specbench.sweep.shard import parse_shard

    loaded = profile if isinstance(profile, Profile) else load_profile(profile)
    loaded = with_overrides(loaded, backend=backend, device=device, max_prompts=max_prompts)
    return run_profile(loaded, out=Path(out) if out is not None else None, fresh=fresh, workers=workers,
                       shard=parse_shard(shard) if shard is not None else None, observer=observer)


def tune(profile=None, *, out=None, replay=None, device: str | None = None, max_prompts: int | None = None,
         objective: str = "tokens_per_s", observer=None, **settings):
    """Tune a profile like `specbench tune` (`settings`: the TuneSettings fields, e.g. trials, seed, storage,
    workers, fresh); returns a `TuneResult` with the trials and the recommendation."""
    from pathlib import Path

    from specbench.profile import Profile, load_profile, with_overrides
    from specbench.core.results import default_out_dir
    from specbench.tune.plan import TuneSettings
    from specbench.tune.objectives import parse_objective
    from specbench.tune.runner import tune as run_tune

    loaded = None
    if profile is not None:
        loaded = profile if isinstance(profile, Profile) else load_profile(profile)
        loaded = with_overrides(loaded, device=device, max_prompts=max_prompts)
    name = loaded.name if loaded is not None else Path(replay).name
    out_dir = Path(out) if out is not None else default_out_dir(name, suffix="-tune")
    tune_settings = TuneSettings(objective=parse_objective(objective), **settings)
    return run_tune(loaded, out_dir=out_dir, settings=tune_settings, replay=Path(replay) if replay else None,
                    observer=observer)
