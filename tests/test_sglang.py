"""SGLang as 0.5.23 has it (docs/engines.md#sglang says where in its source): an n-gram drafted as a chain (its tree
breadth 1, recorded per point), no n-gram match window (ngram_min / ngram_max refused up front), one running-request
cap for the baseline and the speculative launches, and readiness from /ready, not its slow /health. SGLang has no CPU
build: its Python is a stand-in here, a script that answers specbench's version probe and serves like SGLang's HTTP
server (/health generating a token for 2.5 s, /ready 503 while it warms up); the launches' argv are compared whole."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
from typer.testing import CliRunner

from specbench.backends.server.backend import BACKEND, engine_reference
from specbench.backends.server.process import ServerFailed, ServerProcess, free_port
from specbench.cli import app
from specbench.core.results import PointSpec
from specbench.engines import ENGINES, Speculation
from specbench.profile import ProfileError, profile_from_dict

MODEL = "builtin:smollm2-135m-instruct"
SGLANG = ENGINES["sglang"]

# SGLang's Python, stood in: `-c PROBE` is specbench's version probe; `-m sglang.launch_server ... --port P` serves
STANDIN = '''#!{python}
import http.server, json, sys, time
if sys.argv[1] == "-c":
    print("0.5.23")
    sys.exit(0)
started = time.monotonic()


class Sglang(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/health":  # http_server.py health_generate: a token generated, a second's sleep at least
            time.sleep(2.5)
        status = 503 if self.path == "/ready" and time.monotonic() - started < 1.0 else 200  # warming up
        body = json.dumps({{"data": [{{"id": "specbench-target"}}]}} if self.path == "/v1/models" else {{}}).encode()
        self.send_response(status if self.path in ("/health", "/ready", "/v1/models") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), Sglang).serve_forever()
'''


@pytest.fixture
def standin(tmp_path) -> Path:
    python = tmp_path / "sglang-python"
    python.write_text(STANDIN.format(python=sys.executable))
    python.chmod(0o755)
    return python


def profile_data(python: Path, *, extra_args: tuple[str, ...] = (), drafts: bool = True) -> dict:
    return {
        "name": "p", "backend": "server",
        "server": {"engine": "sglang", "binary": str(python), "extra_args": list(extra_args), "ready_timeout_s": 30.0},
        "target": {"model": MODEL},
        "drafts": [{"name": "ngram", "method": "ngram"}, {"name": "small", "method": "draft", "model": MODEL}]
        if drafts else [],
        "sweep": {"gamma": [3], "temperature": [0.0], "concurrency": [1, 64]},
        "workload": {"prompts": "builtin:mixed", "max_prompts": 1, "max_new_tokens": 8}}


def open_session(python: Path, tmp_path: Path, **options):
    return BACKEND.open(profile_from_dict(profile_data(python, **options)),
                        observer=SimpleNamespace(message=lambda text: None), out_dir=tmp_path / "out")


BASELINE = PointSpec.baseline(0.0, 1.0, concurrency=64)
NGRAM = PointSpec("ngram-g3-t0-p1-c64", "ngram", "ngram", 3, 0.0, 1.0, ngram_min=1, ngram_max=3, concurrency=64)
DRAFT = PointSpec("small-g3-t0-p1-c64", "draft", "small", 3, 0.0, 1.0, draft_model=MODEL, concurrency=64)


def serve(python: Path) -> list[str]:
    """The argv of a launch without speculation, its port written PORT."""
    return [str(python), "-m", "sglang.launch_server", "--model-path", engine_reference(MODEL, SGLANG), "--host",
            "127.0.0.1", "--port", "PORT", "--served-model-name", "specbench-target", "--enable-metrics"]


def launched(session, spec: PointSpec) -> list[str]:
    """A launch's argv, its free port (a new one per launch) written PORT."""
    argv, _ = session.launch_argv(spec)
    return [*argv[:argv.index("--port") + 1], "PORT", *argv[argv.index("--port") + 2:]]


def test_every_launch_of_a_run_with_drafts_gets_sglangs_speculative_cap_and_the_ngram_drafts_a_chain(standin, tmp_path):
    session = open_session(standin, tmp_path)
    try:
        target, cap = engine_reference(MODEL, SGLANG), ["--max-running-requests", "48"]
        assert launched(session, BASELINE) == serve(standin) + cap
        assert launched(session, NGRAM) == serve(standin) + [
            "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3", "--speculative-ngram-max-bfs-breadth",
            "1", "--speculative-num-draft-tokens", "4"] + cap
        assert launched(session, DRAFT) == serve(standin) + [
            "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", target,
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens",
            "4"] + cap
        # the tree breadth each point was launched with (1: a chain); nothing drafted, none
        assert session.point_context(NGRAM)["tree_breadth"] == session.point_context(DRAFT)["tree_breadth"] == 1
        assert session.point_context(BASELINE)["tree_breadth"] is None
    finally:
        session.close()


def test_an_eagle3_head_launches_as_a_chain_under_the_same_cap():
    argv = SGLANG.speculation_args(Speculation("eagle3", 5, draft_model="/heads/eagle3"))
    assert argv + SGLANG.shared_args(argv, speculates=True) == [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/heads/eagle3",
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6",
        "--max-running-requests", "48"]
    assert SGLANG.tree_breadth("eagle3") == 1 and SGLANG.tree_breadth("baseline") is None


def test_a_cap_the_profile_sets_is_every_launchs_and_a_baseline_alone_runs_uncapped(standin, tmp_path):
    session = open_session(standin, tmp_path, extra_args=("--max-running-requests=64",))
    try:
        assert launched(session, BASELINE) == serve(standin) + ["--max-running-requests=64"]
        assert launched(session, NGRAM) == serve(standin) + [
            "--speculative-algorithm", "NGRAM", "--speculative-num-steps", "3", "--speculative-ngram-max-bfs-breadth",
            "1", "--speculative-num-draft-tokens", "4", "--max-running-requests=64"]
    finally:
        session.close()
    alone = open_session(standin, tmp_path, drafts=False)
    try:
        assert launched(alone, BASELINE) == serve(standin)
    finally:
        alone.close()


@pytest.mark.parametrize("key", ["ngram_min", "ngram_max"])
def test_an_ngram_match_window_on_sglang_is_refused_before_anything_runs(standin, tmp_path, monkeypatch, key):
    data = profile_data(standin)
    data["drafts"][0][key] = 2
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.toml").write_text(tomli_w.dumps(data))
    result = CliRunner().invoke(app, ["run", "p.toml"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: p.toml: drafts[0].{key}: SGLang 0.5.23 has no n-gram match window: its n-gram drafter matches every "
        "suffix of up to speculative_ngram_max_trie_depth (18) tokens against the tokens recently decoded; remove it, "
        'or use engine = "vllm"')
    assert not (tmp_path / "results").exists()


def test_the_match_window_is_vllms_and_an_sglang_ngram_without_it_is_read():
    data = {"name": "p", "backend": "server", "server": {"engine": "vllm"}, "target": {"model": MODEL},
            "drafts": [{"name": "ngram", "method": "ngram", "ngram_min": 2, "ngram_max": 4}],
            "sweep": {"gamma": [3], "temperature": [0.0]}, "workload": {"prompts": "builtin:mixed"}}
    assert profile_from_dict(data).drafts[0].ngram_max == 4
    data["server"]["engine"] = "sglang"
    with pytest.raises(ProfileError, match=r"^profile: drafts\[0\].ngram_min: SGLang 0.5.23 has no n-gram match"):
        profile_from_dict(data)
    del data["drafts"][0]["ngram_min"], data["drafts"][0]["ngram_max"]
    assert profile_from_dict(data).drafts[0].method == "ngram"


def test_sglang_is_ready_by_its_ready_endpoint_where_its_slow_health_outlasts_the_probe(standin, tmp_path):
    """The same engine, waited on by SGLang's /ready: ready in about a second; by /health (vLLM's and llama.cpp's
    probe), which takes 2.5 s against the probe's 2 s: never ready."""
    def engine(name: str) -> ServerProcess:
        port = free_port()
        return ServerProcess([str(standin), "-m", "sglang.launch_server", "--port", str(port)],
                             log_path=tmp_path / f"{name}.log", port=port).start()

    ready = engine("ready")
    try:
        started = time.monotonic()
        ready.wait_ready(timeout_s=60, health_path=SGLANG.ready_path)
        assert time.monotonic() - started < 30
    finally:
        ready.stop(grace_s=1)
    slow = engine("health")
    with pytest.raises(ServerFailed, match=r"^the server was not ready after 4 s"):
        slow.wait_ready(timeout_s=4, health_path="/health")
    assert not slow.alive()


def test_a_launched_sglang_is_waited_on_by_its_ready_endpoint(standin, tmp_path):
    session = open_session(standin, tmp_path)
    try:
        url = session._serve(BASELINE)  # launches the stand-in and waits until it is ready
        assert url == session.server.url and session.launches[0]["argv"][-2:] == ["--max-running-requests", "48"]
    finally:
        session.close()


def test_tune_searches_no_ngram_length_on_sglang_and_recommends_a_profile_sglang_reads(standin):
    import tomllib

    from specbench.profile import with_overrides
    from specbench.tune.outputs import recommendation_profile
    from specbench.tune.space import space_from_profile

    data = {"name": "p", "backend": "server", "server": {"engine": "vllm"}, "target": {"model": MODEL},
            "drafts": [{"name": "ngram", "method": "ngram"}, {"name": "small", "method": "draft", "model": MODEL}],
            "sweep": {"gamma": [1, 3], "temperature": [0.0]}, "workload": {"prompts": "builtin:mixed"}}
    lengths = {c.ngram_max for c in space_from_profile(profile_from_dict(data)).configs() if c.draft == "ngram"}
    assert lengths == {1, 2, 3}  # vLLM's prompt_lookup_max, from ngram_min to ngram_max
    data["server"] = {"engine": "sglang", "binary": str(standin)}
    sglang = profile_from_dict(data)
    space = space_from_profile(sglang)
    assert [(c.gamma, c.ngram_max) for c in space.configs() if c.draft == "ngram"] == [(1, 3), (2, 3), (3, 3)]
    plan = SimpleNamespace(profile=sglang, space=space, settings=SimpleNamespace(objective=SimpleNamespace(name="x")))
    text = recommendation_profile(plan, [{"point_id": "ngram-g3-t0-p1", "speculate": True, "draft": "ngram",
                                          "gamma": 3, "ngram_max": 3, "temperature": 0.0, "top_p": 1.0}])
    assert tomllib.loads(text)["drafts"] == [{"name": "ngram", "method": "ngram"}]
    assert with_overrides(sglang, max_prompts=1).workload.max_prompts == 1  # re-read without the lengths' defaults
