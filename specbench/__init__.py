"""specbench: benchmark and tune speculative decoding."""

__version__ = "0.1.0"


def run(profile, *, out=None, fresh: bool = False, backend: str | None = None, device: str | None = None,
        max_prompts: int | None = None):
    """Run a profile (a path or a loaded `Profile`) like `specbench run`; returns a `RunResult` with
    `points` and `requests` DataFrames and the output folder. For notebooks."""
    from pathlib import Path

    from specbench.profile import Profile, load_profile, with_overrides
    from specbench.sweep import run_sweep

    loaded = profile if isinstance(profile, Profile) else load_profile(profile)
    loaded = with_overrides(loaded, backend=backend, device=device, max_prompts=max_prompts)
    out_dir = Path(out) if out is not None else Path("results") / loaded.name
    return run_sweep(loaded, out_dir=out_dir, fresh=fresh)
