"""What specbench knows about an external serving engine: how to launch it, which speculative methods it
has, and how a speculation setting becomes its command-line flags. One mapping per engine serves both the
server backend (what it launches) and `tune`'s recommendation (what it tells a user to run), so what is
recommended is exactly what was measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

SERVER_ONLY_METHODS = ("eagle", "eagle3", "mtp", "medusa")  # engines have them; the in-process backends do not


class EngineError(ValueError):
    """A speculation setting the engine cannot run, or an engine that cannot be found; one line."""


@dataclass(frozen=True)
class Speculation:
    """What a launch fixes: the method and its settings. Model references are as the engine loads them
    (a local path, a GGUF file, or a hub id)."""

    method: str  # baseline | ngram | draft | eagle | eagle3 | mtp | medusa
    gamma: int | None = None
    draft_model: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None

    @property
    def speculates(self) -> bool:
        return self.method != "baseline"


class ServingEngine(Protocol):
    name: str
    methods: tuple[str, ...]  # speculative methods besides baseline
    loads_gguf: bool  # a GGUF file (llama.cpp) rather than a Hugging Face folder or hub id
    metrics_prefix: str  # of its Prometheus spec-decode counters, e.g. "vllm:"
    module: str | None  # the Python module it runs as (vLLM, SGLang); None for an executable
    distributions: tuple[str, ...]  # the packages it may be installed as, for its version

    def command(self, *, target: str, host: str, port: int, binary: str | None) -> list[str]:
        """argv that serves `target` without speculation (binary: an explicit executable or interpreter)."""
        ...

    def speculation_args(self, speculation: Speculation, *, help_text: str | None = None) -> list[str]:
        """The flags that add `speculation` to a launch; `help_text` is the binary's --help where flag names
        depend on its version."""
        ...
