"""Backends: how specbench runs a point. One module per backend, each exposing `BACKEND`.

- native: specbench's instrumented engine (per-step acceptance, per-position counts);
- hf: transformers' generate (assisted generation, prompt lookup) as the reference;
- server: a serving engine (vLLM, SGLang, llama.cpp) launched or attached, measured over HTTP under load.

A new backend is a module here, an entry in BACKENDS and its name in BACKEND_NAMES (specbench.profile.schema),
which the profile key `backend` accepts.
"""

from __future__ import annotations

import importlib

from specbench.backends.base import AfterPrompt, Backend, Observer, OnRequest, Session

BACKENDS: dict[str, str] = {  # name (one of the profile's BACKEND_NAMES) -> the module holding its BACKEND
    "native": "specbench.backends.native",
    "hf": "specbench.backends.hf",
    "server": "specbench.backends.server.backend",
}


def get_backend(name: str) -> Backend:
    """The backend of a validated profile (`name` is one of BACKENDS)."""
    return importlib.import_module(BACKENDS[name]).BACKEND


__all__ = ["BACKENDS", "AfterPrompt", "Backend", "Observer", "OnRequest", "Session", "get_backend"]
