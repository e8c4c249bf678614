"""External serving engines (vLLM, SGLang, llama.cpp): how each is launched and how a speculation setting
becomes its flags. Used by the server backend to launch them and by `tune` to recommend settings."""

from __future__ import annotations

from specbench.engines.base import (
    SERVER_ONLY_METHODS, EngineError, Schedule, ServingEngine, Speculation, check_schedule, parse_schedule,
    schedule_text, with_mtp_draft,
)
from specbench.engines.llama_cpp import ENGINE as LLAMA_CPP
from specbench.engines.sglang import ENGINE as SGLANG
from specbench.engines.vllm import ENGINE as VLLM

ENGINES: dict[str, ServingEngine] = {engine.name: engine for engine in (LLAMA_CPP, VLLM, SGLANG)}

__all__ = ["ENGINES", "SERVER_ONLY_METHODS", "EngineError", "Schedule", "ServingEngine", "Speculation", "check_schedule",
           "parse_schedule", "schedule_text", "with_mtp_draft"]
