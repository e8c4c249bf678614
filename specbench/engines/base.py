"""What specbench knows about an external serving engine: how to launch it, which speculative methods it
has, and how a speculation setting becomes its command-line flags. One mapping per engine serves both the
server backend (what it launches) and `tune`'s recommendation (what it tells a user to run), so what is
recommended is exactly what was measured."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol

SERVER_ONLY_METHODS = ("eagle", "eagle3", "mtp", "medusa")  # engines have them; the in-process backends do not

# a gamma per batch size: inclusive ranges (first batch size, last batch size, gamma), the first from batch size 1;
# gamma 0 drafts nothing in its range. vLLM's `num_speculative_tokens_per_batch_size` (its dynamic speculation)
Schedule = tuple[tuple[int, int, int], ...]


class EngineError(ValueError):
    """A speculation setting the engine cannot run, or an engine that cannot be found; one line. `field`: the draft's
    key it is about, where that is not its gamma."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Speculation:
    """What a launch fixes: the method and its settings. Model references are as the engine loads them
    (a local path, a GGUF file, or a hub id)."""

    method: str  # baseline | ngram | draft | eagle | eagle3 | mtp | medusa
    gamma: int | None = None
    draft_model: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    gamma_schedule: Schedule | None = None  # a gamma per batch size; `gamma` is then its largest
    # an acceptance what-if: per-position unconditional rates the engine imposes instead of verifying (one per position
    # up to gamma); only engines with `imposes_acceptance` run it
    imposed_acceptance: tuple[float, ...] | None = None
    # a draft model with another tokenizer than the target's: how it drafts ("intersection" | "text"); only engines
    # whose `vocabularies` name it run it
    vocabulary: str | None = None

    @property
    def speculates(self) -> bool:
        return self.method != "baseline"


def with_mtp_draft(speculation: Speculation, engine, target: str) -> Speculation:
    """`speculation`, where it drafts with the target's MTP layers on an engine that loads them from a draft path it
    does not fill in itself for every architecture (`mtp_reads_draft_path`: SGLang), with the target as that path."""
    if speculation.method != "mtp" or speculation.draft_model is not None:
        return speculation
    if not getattr(engine, "mtp_reads_draft_path", False):
        return speculation
    return dataclasses.replace(speculation, draft_model=target)


def check_schedule(ranges) -> Schedule:
    """`ranges` as a schedule, checked as vLLM checks it (its order kept); EngineError says what is wrong."""
    schedule = []
    for index, entry in enumerate(ranges):
        if not isinstance(entry, (list, tuple)) or len(entry) != 3 or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in entry):
            raise EngineError(f"entry {index}: must be [first batch size, last batch size, gamma], three integers "
                              f"(got {list(entry) if isinstance(entry, (list, tuple)) else entry!r})")
        start, end, gamma = entry
        if start < 1 or end < start or gamma < 0:
            raise EngineError(f"entry {index}: needs 1 <= first <= last and gamma >= 0 (got {list(entry)})")
        if schedule and start != schedule[-1][1] + 1:
            raise EngineError(f"entry {index}: must start at batch size {schedule[-1][1] + 1}, right after the "
                              f"previous range (got {start}): ranges ascend without gaps or overlaps")
        schedule.append((start, end, gamma))
    if not schedule:
        raise EngineError("must list at least one range")
    if schedule[0][0] != 1:
        raise EngineError(f"entry 0: must start at batch size 1 (got {schedule[0][0]})")
    if max(gamma for _, _, gamma in schedule) < 1:
        raise EngineError("drafts at no batch size (every gamma is 0): drop the draft, the baseline is that")
    return tuple(schedule)


def schedule_text(schedule: Schedule) -> str:
    """"1-3:3,4-8:0": a schedule as one short string (a column of the result files)."""
    return ",".join(f"{start}-{end}:{gamma}" for start, end, gamma in schedule)


def parse_schedule(text: str) -> Schedule:
    """The inverse of `schedule_text`."""
    out = []
    for part in text.split(","):
        span, _, gamma = part.partition(":")
        start, _, end = span.partition("-")
        out.append((int(start), int(end), int(gamma)))
    return tuple(out)


class ServingEngine(Protocol):
    name: str
    methods: tuple[str, ...]  # speculative methods besides baseline
    loads_gguf: bool  # a GGUF file (llama.cpp) rather than a Hugging Face folder or hub id
    metrics_prefix: str  # of its Prometheus spec-decode counters, e.g. "vllm:"
    module: str | None  # the Python module it runs as (vLLM, SGLang); None for an executable
    distributions: tuple[str, ...]  # the packages it may be installed as, for its version
    prefix_cache_reset: str | None  # the path a POST to empties its prefix cache; None where it has none
    launch_env: dict[str, str]  # environment every launch gets (the profile's server.env over it)
    # variables naming where it keeps temporary files (IPC sockets): each launch points them at a folder of its own,
    # removed when the engine ends, unless the profile's server.env or the environment sets them
    scratch_env: tuple[str, ...]

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        """argv that serves `target` without speculation (binary: an explicit executable or interpreter)."""
        ...

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None,
                         version: str | None = None) -> list[str]:
        """The flags that add `speculation` to a launch; `help_text` is the binary's --help where flag names
        depend on its version, `version` the installed package's (a Python engine's)."""
        ...

    gpu_flags: tuple[str, ...]  # the flags `gpu_args` sets (server.extra_args may not set them too)

    def gpu_args(self, gpus: int) -> list[str]:
        """The flags that run a launch on the `gpus` GPUs CUDA_VISIBLE_DEVICES shows it (at least one)."""
        ...
