"""The server backend: specbench launches the serving engine a team deploys (vLLM, SGLang, llama.cpp) — or
attaches to one already running — and measures it over HTTP at the profile's concurrency levels.

A launch fixes method, draft and gamma; temperature, top_p and concurrency are per request, so one launch
serves all their points (the run orders points by `launch_key`). The baseline is the same engine launched
without speculation. Acceptance comes from the engine (its /metrics counters, else per-response counts),
and the point says which. A point that fails because the engine exited, hung or outlived the point's deadline kills
the engine; the next point launches it again."""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specbench.backends.base import AfterPrompt, Observer, OnRequest
from specbench.backends.server import checks, client, heads, placement, vocab, watch
from specbench.backends.server.measure import measure_point
from specbench.backends.server.process import HOST, ServerFailed, ServerProcess, end_leftovers, free_port
from specbench.engines import ENGINES, EngineError, ServingEngine, Speculation, parse_schedule, with_mtp_draft
from specbench.models.load import hf_folder, hub_snapshot, load_tokenizer, resolve_model
from specbench.profile import Profile, ProfileError
from specbench.core import gpus
from specbench.core.results import PointSpec
from specbench.workloads.build import build_workload


def launch_key(spec: PointSpec) -> tuple:
    """What a launch fixes; the baseline launches without speculation."""
    if spec.method == "baseline":
        return ("baseline",)
    return (spec.method, spec.draft, spec.draft_model, spec.gamma, spec.ngram_min, spec.ngram_max, spec.gamma_schedule,
            spec.imposed_acceptance)


class ServerSession:
    backend = "server"

    def __init__(self, profile: Profile, *, observer: Observer):
        self.profile = profile
        self.observer = observer
        self.settings = profile.server
        self.attached = self.settings.url is not None
        self.engine: ServingEngine | None = ENGINES.get(self.settings.engine)
        self.api_key = checks.api_key(profile)
        where = f"{profile.source}: " if profile.source else ""
        # the GPUs every launch runs on (none on a CPU machine, or attached): refused before anything loads
        self.gpus = () if self.attached else placement.launch_group(
            self.settings, gpus.machine_gpus(os.environ.get("CUDA_VISIBLE_DEVICES")), where=where)
        if not self.attached:
            self._check_methods(where)
            checks.check_command(self.settings.command, where)
            checks.check_extra_args(self.settings.extra_args, where, gpu_flags=self.engine.gpu_flags if self.gpus else ())
            self.binary = checks.find_binary(self.engine, self.settings, where)
            self.help_text = checks.help_text(self.binary, self.engine, self.settings)
            self.python_version = None if self.engine.loads_gguf or self.settings.command is not None else \
                checks.installed_version(self.binary, self.engine, where)
            imposing = [index for index, draft in enumerate(profile.drafts) if draft.acceptance]
            if imposing and self.python_version is not None and getattr(self.engine, "imposes_acceptance", False):
                checks.check_imposes_acceptance(self.binary, self.python_version, where,
                                                f"drafts[{imposing[0]}].acceptance")
        self.url = self.settings.url.rstrip("/") if self.attached else None
        # attached: the running deployments measured side by side, the baseline's (server.url) and each draft's
        self.deployments: dict[str | None, str] = {None: self.url, **{d.name: d.url.rstrip("/") for d in profile.drafts}} \
            if self.attached else {}
        self.model_name = self.settings.model
        self._models: dict[str, str] = {}  # url -> the model it serves (the first it lists, or server.model)
        self._last: dict[str, Any] = {}
        for name, url in self.deployments.items():  # before anything slow: a url nobody answers is one line at once
            key = "server.url" if name is None else f"drafts[{profile.drafts.index(self._draft(name))}].url"
            try:
                self._models[url] = self.settings.model or _first_model(url, self.api_key)
            except ServerFailed as error:
                raise ProfileError(f"{where}{key}: {url} does not answer ({error}); start the server or fix the url") \
                    from None
        if self.attached:
            self.model_name = self._models[self.url]
        observer.message(f"loading the tokenizer of {profile.target.model}")
        self.tokenizer, self.target_identity = load_tokenizer(profile.target.model)
        self.workload = build_workload(profile.workload, self.tokenizer, seed=profile.run.seed, where=where)
        checks.check_context(profile, self.workload, engine=self.settings.engine,
                             extra_args=() if self.attached else self.settings.extra_args, where=where)
        # EAGLE-3 heads: trained:PRESET distilled (or cached), folders checked against the target, GGUF for llama.cpp
        self.heads = {} if self.attached else heads.engine_heads(profile, self.engine, binary=self.binary, where=where,
                                                                 say=observer.message)
        if not self.attached:
            self._check_draft_references(where)
        # drafts of another tokenizer: how each drafts, and what it shares with the target
        self.vocabularies = {} if self.attached else vocab.draft_vocabularies(
            profile, self.engine, self.tokenizer, where=where, say=observer.message)
        # kept-alive connections where the engine keeps them: llama-server closes each after its streamed response
        self.keep_alive = self.settings.engine != "llama.cpp"
        self.prompts = self.workload.prompts
        self.prompt_tokens = self.workload.prompt_tokens
        self.log_dir: Path | None = None  # set by the run: server logs go to its output folder
        self.server: ServerProcess | None = None
        self.claim: gpus.Claim | None = None  # the running launch's processes on its GPUs, as NVML numbers them
        self._launched: tuple | None = None
        self._failed_launches: dict[tuple, str] = {}  # launch key -> where its failure is logged
        self.launches: list[dict[str, Any]] = []  # argv and log file of every launch, for the manifest
        self.leftovers: list[dict[str, Any]] = []  # engines an earlier run of the folder left running, ended

    def _check_draft_references(self, where: str) -> None:
        """Each draft as the engine will load it, before any launch: one line where the engine would take it for
        another method (vLLM reads a method off the draft's path)."""
        check = getattr(self.engine, "check_draft_reference", None)
        for index, draft in enumerate(self.profile.drafts):
            if check is None or draft.method == "ngram" or not draft.model:
                continue
            head = self.heads.get(draft.name)
            reference = head.reference if head is not None else engine_reference(draft.model, self.engine)
            try:
                check(draft.method, reference)
            except EngineError as error:
                raise ProfileError(f"{where}drafts[{index}].model: {error}") from None

    def end_leftovers(self) -> None:
        """End (and say so) the engines an earlier run of this folder launched and left running."""
        for leftover in end_leftovers((self.log_dir or Path(".")) / "server-logs"):
            self.leftovers.append(leftover)
            self.observer.message(f"ended {Path(leftover['argv'][0]).name if leftover['argv'] else 'an engine'} "
                                  f"(process group {leftover['pid']}), left running by an earlier run of this folder "
                                  f"(pid {leftover['launched_by_pid']}; log {leftover['log']})")

    # --- identity -----------------------------------------------------------------------------

    @property
    def identity(self) -> dict[str, Any]:
        return {"target": [self.target_identity, None], "backend": "server", "engine": self.settings.engine,
                "engine_version": self._engine_version(), "attached": self.settings.url,
                "deployments": {name: url for name, url in self.deployments.items() if name is not None},
                "command": list(self.settings.command or ()), "extra_args": list(self.settings.extra_args)}

    def _draft(self, name: str):
        return next(d for d in self.profile.drafts if d.name == name)

    def url_of(self, spec: PointSpec) -> str | None:
        """Where an attached point's deployment answers (the baseline's for the baseline); None when launched."""
        if not self.attached:
            return None
        return self.deployments[None if spec.method == "baseline" else spec.draft]

    def draft_identity(self, spec: PointSpec) -> str | None:
        if self.attached and spec.method != "baseline":
            return f"{self.url_of(spec)} {self._models[self.url_of(spec)]}"
        head = self.heads.get(spec.draft)
        return head.identity if head is not None else spec.draft_model

    def _vocabulary(self, spec: PointSpec) -> str | None:
        """How a draft model drafts across tokenizers: as found up front, else as its profile says (None: the
        target's own tokenizer)."""
        found = self.vocabularies.get(spec.draft)
        return found[0] if found else next((d.vocabulary for d in self.profile.drafts if d.name == spec.draft), None)

    def point_context(self, spec: PointSpec) -> dict[str, Any]:
        vocabulary = self._vocabulary(spec) if spec.method == "draft" else None
        shared = self.vocabularies.get(spec.draft, (None, None))[1] if spec.method == "draft" else None
        return {"backend": "server", "target_model": self.profile.target.model, "weight_mb": None,
                **({"vocabulary": vocabulary} if vocabulary is not None else {}),
                **({"shared_tokens": shared} if shared is not None else {}),
                **({"tree_breadth": self.engine.tree_breadth(spec.method)}
                   if not self.attached and hasattr(self.engine, "tree_breadth") else {})}

    def gpu_uuids(self) -> tuple[str, ...]:
        """The GPUs of the running launch (an attached server's are unknown: not checked)."""
        return tuple(gpu.uuid for gpu in self.gpus) if self.server is not None else ()

    def own_pids(self) -> list[int]:
        return [os.getpid(), *(self.server.descendants() if self.server is not None and self.server.alive() else [])]

    def gpu_claimed(self) -> frozenset[int]:
        return self.claim.pids if self.server is not None and self.claim is not None else frozenset()

    def request_timeout_s(self, budget: int) -> float:
        return watch.request_timeout_s(self.settings.request_timeout_s, budget)

    def limits(self, spec: PointSpec, requests: list[client.Request]) -> client.Limits:
        """The deadlines of a point starting now, and what tells that its engine exited or hung."""
        timeout = watch.point_timeout_s(self.settings.point_timeout_s, timeouts=[r.timeout_s for r in requests],
                                        concurrency=spec.concurrency, request_rate=spec.request_rate,
                                        warmup=self.profile.run.warmup * (spec.concurrency or 1),
                                        lead_in_s=self.profile.load.lead_in_s, window_s=self.profile.load.window_s)
        return watch.limits(url=self.server.url if self.server is not None else self.url_of(spec), server=self.server,
                            point_timeout=timeout)

    def verify_costs(self, max_tokens: int) -> tuple[float, ...]:
        return ()  # a server's forward pass cannot be timed from outside

    # --- running points -------------------------------------------------------------------------

    def run_point(self, spec: PointSpec, *, point_key: str, on_request: OnRequest,
                  after_prompt: AfterPrompt | None) -> list[dict[str, Any]]:
        url = self._serve(spec)
        if self.attached:
            self.model_name = self._models[url]
        elif self.model_name is None:
            self.model_name = _first_model(url, self.api_key)
        try:
            rows, self._last = measure_point(self, spec, url=url, point_key=point_key, on_request=on_request,
                                             after_prompt=after_prompt)
        except Exception as error:
            if self.server is not None and (getattr(error, "engine_unusable", False) or not self._healthy()):
                self.observer.message(f"killing {self.settings.engine}: {error}")
                self._stop(grace_s=0.0)  # the next point launches it again
            raise
        return rows

    def _healthy(self) -> bool:
        """Whether the launched engine runs, is not stopped and answers /health."""
        return (self.server.alive() and not self.server.progress()[0]
                and asyncio.run(client.answers(f"{self.server.url}/health", timeout_s=watch.HEALTH_TIMEOUT_S)))

    def point_measurements(self) -> dict[str, Any]:
        """Point-level figures of the last run_point: the engine's acceptance counters and their source,
        the server's peak memory."""
        return dict(self._last)

    def _serve(self, spec: PointSpec) -> str:
        """The URL of a server running `spec`'s launch: attached, already running, or launched now."""
        if self.attached:
            return self.url_of(spec)
        key = launch_key(spec)
        if self.server is not None and self._launched == key and self.server.alive():
            return self.server.url
        if key in self._failed_launches:  # its other points fail at once rather than wait out another start-up
            raise ServerFailed(f"this launch failed earlier ({self._failed_launches[key]})")
        self._stop()
        argv, env = self.launch_argv(spec)
        port = int(argv[argv.index("--port") + 1]) if "--port" in argv else free_port()
        log_dir = self.log_dir or Path(".")
        log_path = log_dir / "server-logs" / f"{len(self.launches) + 1:02d}-{_slug(spec)}.log"
        # the log as a path inside the result folder (it moves with the folder)
        self.launches.append({"point": spec.point_id, "argv": argv,
                              "log": str(log_path.relative_to(log_dir)) if self.log_dir else str(log_path.resolve()),
                              **({"gpus": [gpu.index for gpu in self.gpus]} if self.gpus else {})})
        self.observer.message(f"launching {self.settings.engine}: {_slug(spec)} (log {log_path})")
        uuids = [gpu.uuid for gpu in self.gpus]
        before = gpus.read(uuids)  # what the GPUs hold without it: the claim below tells its processes by what appears
        self.server = ServerProcess(argv, log_path=log_path, env=env, port=port,
                                    scratch_env=self.engine.scratch_env).start()
        self._launched = key
        try:
            self.server.wait_ready(timeout_s=self._ready_timeout_s(spec),
                                   health_path=getattr(self.engine, "ready_path", "/health"))
        except ServerFailed as error:
            self._failed_launches[key] = f"log {log_path}"
            self._stop()
            raise error from None
        after = gpus.read(uuids) if before is not None else None
        self.claim = gpus.claim(before, after, own=set(self.own_pids())) if after is not None else None
        if self.claim is not None:
            self.launches[-1]["gpu_claim"] = self.claim.as_manifest()
        return self.server.url

    def _ready_timeout_s(self, spec: PointSpec) -> float:
        head = self.heads.get(spec.draft)
        models = [engine_reference(self.profile.target.model, self.engine)]
        if head is not None or spec.draft_model:
            models.append(head.reference if head is not None else engine_reference(spec.draft_model, self.engine))
        return placement.ready_timeout_s(self.settings.ready_timeout_s, [placement.model_bytes(m) for m in models])

    def launch_argv(self, spec: PointSpec) -> tuple[list[str], dict[str, str]]:
        """The exact argv (and extra environment) a point's launch runs."""
        engine = self.engine
        target = engine_reference(self.profile.target.model, engine)
        head = self.heads.get(spec.draft)
        draft = head.reference if head is not None else (
            engine_reference(spec.draft_model, engine) if spec.draft_model else None)
        vocabulary = self._vocabulary(spec) if spec.method == "draft" else None
        speculation = with_mtp_draft(Speculation(spec.method, spec.gamma, draft,
                                                 spec.ngram_min, spec.ngram_max,
                                                 parse_schedule(spec.gamma_schedule) if spec.gamma_schedule else None,
                                                 spec.imposed_rates, vocabulary), engine, target)
        port = free_port()
        if self.settings.command is not None:
            values = {"target": target, "draft": speculation.draft_model or "", "host": HOST, "port": str(port)}
            argv = [part.format(**values) for part in self.settings.command]
            if "--port" not in argv:
                argv += ["--port", str(port)]
        else:
            argv = engine.command(target=target, host=HOST, port=port, binary=self.binary)
        argv += engine.speculation_args(speculation, help_text=self.help_text, version=self.python_version)
        argv += (engine.gpu_args(len(self.gpus)) if self.gpus else []) + list(self.settings.extra_args)
        if hasattr(engine, "shared_args"):  # what the baseline shares with the drafts (SGLang: its running-request cap)
            argv += engine.shared_args(argv, speculates=bool(self.profile.drafts))
        env = {**engine.launch_env, **dict(self.settings.env), **placement.launch_env(self.gpus)}
        if engine.loads_gguf and self.binary and os.sep in self.binary:  # llama.cpp's shared libraries lie beside it
            folder = str(Path(self.binary).resolve().parent)
            env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (folder, env.get("LD_LIBRARY_PATH",
                                                                                   os.environ.get("LD_LIBRARY_PATH"))) if p)
        return argv, env

    def _check_methods(self, where: str) -> None:
        for index, draft in enumerate(self.profile.drafts):
            if draft.method not in self.engine.methods:
                raise ProfileError(f"{where}drafts[{index}].method: {self.settings.engine} has no method "
                                   f"\"{draft.method}\" (it has: {', '.join(self.engine.methods)})")

    def _engine_version(self) -> str | None:
        if self.attached:
            return None
        if self.engine.loads_gguf:
            return (self.help_text or "").partition("version:")[2].strip().split("\n")[0][:80] or None
        return self.python_version

    def _stop(self, *, grace_s: float = 10.0) -> None:
        """Stop the engine, then wait until its processes are gone and its GPU memory is back (a relaunch needs it)."""
        if self.server is not None:
            pids, claim = self.server.descendants(), self.claim
            self.server.stop(grace_s=grace_s)
            self.server, self.claim = None, None
            self._launched = None
            placement.wait_released(pids, self.gpus, claim=claim, alive=placement.pid_alive,
                                    nvml=gpus.open_nvml() if self.gpus else None)

    def describe(self) -> dict[str, Any]:
        from specbench.backends.inprocess import environment_base

        described: dict[str, Any] = {
            "models": {"target": {"model": self.profile.target.model, "identity": self.target_identity},
                       "drafts": {d.name: {"model": d.model, "method": d.method,
                                           **({"head": asdict(self.heads[d.name])} if d.name in self.heads else {})}
                                  for d in self.profile.drafts}},
            "environment": environment_base(),
            "server": {"engine": self.settings.engine, "engine_version": self._engine_version(),
                       "attached": self.settings.url, "launches": self.launches,
                       **({"deployments": {name: url for name, url in self.deployments.items() if name is not None}}
                          if self.attached else {}),
                       "gpus": [asdict(gpu) for gpu in self.gpus], "tensor_parallel": self.settings.tensor_parallel,
                       **({"ended_leftovers": self.leftovers} if self.leftovers else {})},
        }
        if self.attached:  # what each deployment says about itself, by the draft it serves ("baseline": server.url)
            described["server"]["reports"] = {name or "baseline": {"url": url, **_server_report(url, self.api_key)}
                                              for name, url in self.deployments.items()}
        return described

    def close(self) -> None:
        self._stop()


class ServerBackend:
    name = "server"
    pins_local_devices = False
    launch_key = staticmethod(launch_key)

    def open(self, profile: Profile, *, observer: Observer, out_dir: Path | None = None) -> ServerSession:
        try:
            session = ServerSession(profile, observer=observer)
            session.log_dir = out_dir
            session.end_leftovers()
            return session
        except EngineError as error:
            raise ProfileError(str(error)) from None


BACKEND = ServerBackend()


def engine_reference(ref: str, engine: ServingEngine) -> str:
    """A model reference as the engine loads it: a GGUF file for llama.cpp; a Hugging Face folder (a GGUF
    converted once) or a hub id for the others."""
    source = resolve_model(ref)
    if engine.loads_gguf:
        if source.kind != "gguf":
            raise ProfileError(f"{ref}: {engine.name} loads GGUF files; point the model at a .gguf file or a builtin")
        return source.location
    if source.kind == "hub":  # a pinned revision is served from its snapshot; an unpinned id the engine fetches itself
        return ref if source.revision is None else str(hub_snapshot(ref))
    return str(hf_folder(ref))


def _first_model(url: str, api_key: str | None) -> str:
    import asyncio

    try:
        listed = asyncio.run(client.get_json(f"{url}/v1/models", api_key=api_key))
        return listed["data"][0]["id"]
    except Exception as error:  # noqa: BLE001 - any failure is one line
        raise ServerFailed(f"{url}/v1/models did not list a model: {type(error).__name__}: {error}") from None


def _server_report(url: str, api_key: str | None) -> dict[str, Any]:
    """What an attached server says about itself (its model list and, where it has one, /version)."""
    import asyncio

    report: dict[str, Any] = {}
    for path in ("/v1/models", "/version", "/props"):
        try:
            report[path] = asyncio.run(client.get_json(url + path, api_key=api_key))
        except Exception:  # noqa: BLE001 - optional endpoints
            continue
    return report


def _slug(spec: PointSpec) -> str:
    if spec.method == "baseline":
        return "baseline"
    return f"{spec.draft}-sched" if spec.gamma_schedule else f"{spec.draft}-g{spec.gamma}"
