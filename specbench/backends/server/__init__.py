"""The server backend: a serving engine (vLLM, SGLang, llama.cpp) launched or attached, measured over HTTP under
load.

Modules: ``backend`` (the backend: launches, sessions, points), ``process`` (the engine's process group, its log,
readiness), ``client`` and ``stream`` (the load generator: closed-loop concurrency, open-loop request rates,
streamed responses), ``measure`` (a point's requests into rows), ``metrics`` (the engine's /metrics counters),
``checks`` (what is refused before a launch), ``heads`` (EAGLE-3 heads in the engine's format), ``watch`` (a hung
or dead engine), ``lifeline`` (no engine outlives specbench).
"""
