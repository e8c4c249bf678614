"""The profile's [run] table: repeats, warm-up, seed, and whether the native backend compiles its steps."""

from __future__ import annotations

from pydantic import StrictBool, StrictInt

from specbench.profile.fields import NonNegativeInt, PositiveInt, Table


class RunSpec(Table):
    repeats: PositiveInt = 1
    warmup: NonNegativeInt = 1
    seed: StrictInt = 0
    # native backend: static KV caches and compiled steps (CUDA graphs on a GPU); unset: on a GPU, off on a CPU
    compile: StrictBool | None = None
