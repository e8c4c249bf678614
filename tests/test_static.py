"""The static KV cache and compiled steps (specbench.decoding.static): lossless as the dynamic path (greedy
equality, the sampling distribution), rollback as an index move, one compiled graph per bucket, and the models
it refuses by name."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import torch
from torch._dynamo.utils import counters
from typer.testing import CliRunner

from specbench.cli import app

from specbench.decoding.proposers import BaselineProposer, DraftModelProposer, NgramProposer
from specbench.decoding.decode import StepState, generate
from specbench.decoding import decode
from specbench.decoding.static import BUCKETS, StaticModel, bucket, freeze_refusal, unsupported
from specbench.profile import load_profile, with_overrides
from test_decoding import MAX_NEW, PROMPT, check_accounting, tiny_mistral
from test_sampling import P_MIN, TOKENS, VOCAB, empirical_joint, exact_joint, inverted_verify_sampling, pair_p_values
from tiny import DEVICE, perturbed, tiny_llama, tiny_profile, write_project

CAPACITY = len(PROMPT) + MAX_NEW + BUCKETS[-1]
# one worker runs the module, so each module fixture compiles its models once (on two workers, `models` compiled twice:
# 25 s and 22 s of setup in one CI run on a 2-core AMD EPYC)
pytestmark = pytest.mark.xdist_group("static")


@pytest.fixture(scope="module")
def models():
    """The target and a close draft, eager, and each on a static cache with its steps compiled."""
    target = tiny_llama()
    draft = perturbed(target, scale=0.01)
    static_target = StaticModel(target, capacity=CAPACITY)
    static_target.warm_up(range(1, 7))  # gamma <= 5
    static_draft = StaticModel(draft, capacity=CAPACITY)
    static_draft.warm_up(range(1, 3))
    return target, draft, static_target, static_draft


def test_gamma_1_to_8_needs_five_buckets_and_pads_little():
    assert sorted({bucket(gamma + 1) for gamma in range(1, 9)}) == [2, 4, 6, 9]
    assert bucket(1) == 1 and bucket(17) == 24
    assert all(bucket(t) >= t and bucket(t) <= 1.5 * t for t in range(1, 40))


def test_compiled_greedy_equals_the_eager_baseline(models):
    target, draft, static_target, static_draft = models
    expected = generate(target, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    baseline = generate(static_target, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0,
                        max_new_tokens=MAX_NEW)
    assert baseline.output_ids == expected.output_ids
    for gamma in (1, 3, 5):
        for proposer in (DraftModelProposer(static_draft, vocab_size=64, device=DEVICE), NgramProposer(device=DEVICE)):
            trace = generate(static_target, proposer, PROMPT, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW)
            assert trace.output_ids == expected.output_ids, (proposer.method, gamma)
            check_accounting(trace, gamma=gamma)
            assert 0 < trace.accepted_tokens < trace.drafted_tokens, "the test needs accepted and rejected drafts"


def test_a_rollback_moves_an_index_and_no_step_recompiles(models):
    target, draft, static_target, static_draft = models
    keys = [layer.keys for layer in static_target.cache.layers]
    before = [k.clone() for k in keys]
    graphs = counters["stats"]["unique_graphs"]
    proposer = DraftModelProposer(static_draft, vocab_size=64, device=DEVICE)
    states: list[tuple[StepState, int]] = []
    for gamma in (1, 2, 3, 4, 5):
        trace = generate(static_target, proposer, PROMPT, gamma=gamma, temperature=0.0, max_new_tokens=MAX_NEW,
                         on_step=lambda state: states.append((state, static_draft.length)))
        assert trace.rejected_steps > 0
    assert counters["stats"]["unique_graphs"] == graphs, "a step compiled a new graph after the warm-up"
    for state, draft_length in states:
        assert state.target_cache_length == state.sequence_length - 1
        assert state.sequence_length - 2 <= draft_length <= state.sequence_length - 1
    # the same buffers throughout, written in place (a copy on rollback would leave them as they were)
    assert all(layer.keys is k for layer, k in zip(static_target.cache.layers, keys))
    assert any(not torch.equal(k, b) for k, b in zip(keys, before))


def test_models_the_static_cache_cannot_serve_are_named():
    assert unsupported(tiny_llama()) is None
    assert unsupported(tiny_mistral(sliding_window=16)) == (
        "cache layers StaticSlidingWindowLayer (sliding window or linear attention)")
    with pytest.raises(ValueError, match=re.escape("model 'mistral' cannot use a static KV cache: cache layers "
                                                   "StaticSlidingWindowLayer (sliding window or linear attention)")):
        StaticModel(tiny_mistral(sliding_window=16), capacity=64, name="mistral")


def test_a_request_longer_than_the_cache_is_refused_before_it_starts(models):
    target, _, _, _ = models
    small = StaticModel(target, capacity=40, compile=False)
    with pytest.raises(ValueError, match=re.escape(f"a request of {len(PROMPT) + MAX_NEW} tokens does not fit the "
                                                   "static KV cache of model 'LlamaForCausalLM' (40 positions); build "
                                                   f"it with capacity >= {len(PROMPT) + MAX_NEW + 16}")):
        generate(small, BaselineProposer(DEVICE), PROMPT, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)


def test_run_compile_is_a_profile_key_and_a_flag():
    profile = load_profile("profiles/quickstart.toml")
    assert profile.run.compile is None
    assert with_overrides(profile, compile=False).run.compile is False
    assert with_overrides(profile, compile=True).run.compile is True


def test_a_run_records_its_cache_per_point_and_its_compilation_in_the_manifest(tmp_path, models_dir, monkeypatch):
    """`specbench run --compile`: every point static, greedy outputs equal to the baseline's, each model's compile
    seconds per step bucket in the manifest; `--no-compile`: dynamic, and why."""
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, profile=tiny_profile(gamma=(2, 3), temperature=(0.0,), repeats=1),
                  prompts=[("the cat sat on the mat and the dog ran fast", "chat")], models=models_dir)
    for flag, kind in (("--compile", "static"), ("--no-compile", "dynamic")):
        result = CliRunner().invoke(app, ["run", "tiny.toml", flag, "--out", kind])
        assert result.exit_code == 0, result.output
        points = pd.read_parquet(tmp_path / kind / "points.parquet")
        assert (points["status"] == "ok").all() and points["outputs_match_baseline"].all()
        assert list(points["kv_cache"]) == [kind] * len(points) == [kind] * 5
        compiled = json.loads((tmp_path / kind / "manifest.json").read_text())["compile"]
        if kind == "dynamic":
            assert set(points["kv_cache_reason"]) == {"run.compile is off"}
            assert compiled == {"enabled": False}
            continue
        assert points["kv_cache_reason"].isna().all()
        assert compiled["enabled"] and compiled["fallback"] is None
        models = compiled["models"]
        assert set(models) == {"target", "draft close"}
        assert set(models["target"]["compile_s_by_step_tokens"]) == {"1", "2", "4"}  # gamma 2, 3
        assert set(models["draft close"]["compile_s_by_step_tokens"]) == {"1", "2"}
        assert all(entry["kv_cache"] == "static" and entry["compile_s"] > 0 for entry in models.values())
        assert all(entry["compile_mb"] is not None and entry["compile_mb"] >= 0 for entry in models.values())


def test_a_draft_that_cannot_compile_keeps_every_point_eager_and_says_why(tmp_path, models_dir, monkeypatch):
    """An int8 dynamically quantised draft (its packed weights are opaque to torch.compile, as the quickstart's
    self-draft's are): no point of the run decodes compiled — a compiled baseline under eager draft points would
    credit the draft with the compiler's loss — and the target's compilation is not spent."""
    monkeypatch.chdir(tmp_path)
    profile = tiny_profile(gamma=(2,), temperature=(0.0,), repeats=1).replace(
        'model = "./draft"\n', 'model = "./draft"\nquantize = "int8"\n')
    write_project(tmp_path, profile=profile, prompts=[("the cat sat on the mat and the dog ran fast", "chat")],
                  models=models_dir)
    result = CliRunner().invoke(app, ["run", "tiny.toml", "--compile", "--out", "out"])
    assert result.exit_code == 0, result.output
    points = pd.read_parquet(tmp_path / "out" / "points.parquet")
    assert (points["status"] == "ok").all() and list(points["kv_cache"]) == ["dynamic"] * 3
    reasons = set(points["kv_cache_reason"])
    assert len(reasons) == 1 and re.fullmatch(r"draft close failed to compile: .+: every point decodes eagerly",
                                              reasons.pop())
    compiled = json.loads((tmp_path / "out" / "manifest.json").read_text())["compile"]
    assert compiled["enabled"] and compiled["fallback"].startswith("draft close failed to compile")
    assert compiled["models"] == {}


# --- the sampling distribution on the compiled path (test_sampling's end-to-end check) -------------------


@pytest.fixture(scope="module")
def sampling_setup():
    target = tiny_llama(vocab_size=VOCAB, layers=1, hidden=32, seed=3, init_std=0.3)
    start = [3, 7, 1, 12, 5]
    continuation = generate(target, BaselineProposer(DEVICE), start, gamma=1, temperature=0.0, max_new_tokens=14)
    prompt = start + list(continuation.output_ids)
    capacity = len(prompt) + TOKENS + BUCKETS[-1]
    static_target, static_draft = (StaticModel(model, capacity=capacity)
                                   for model in (target, perturbed(target, scale=0.3)))
    return target, static_target, static_draft, prompt


def factory(method: str, static_draft):
    return {"baseline": lambda: BaselineProposer(DEVICE),
            "draft": lambda: DraftModelProposer(static_draft, vocab_size=VOCAB, device=DEVICE),
            "ngram": lambda: NgramProposer(ngram_min=1, ngram_max=2, device=DEVICE)}[method]


@pytest.mark.parametrize("method", ["baseline", "draft", "ngram"])
def test_compiled_generation_matches_the_target_distribution(sampling_setup, method):
    target, static_target, static_draft, prompt = sampling_setup
    exact = exact_joint(target, prompt, temperature=1.0, top_p=0.8)
    counts, drafted, accepted = empirical_joint(static_target, factory(method, static_draft), prompt,
                                             temperature=1.0, top_p=0.8)
    if method != "baseline":
        assert 0.05 * drafted < accepted < 0.95 * drafted, "the test needs both accepted and rejected drafts"
    assert min(pair_p_values(counts, exact)) > P_MIN


def test_a_broken_acceptance_rule_is_caught_on_the_compiled_path(sampling_setup, monkeypatch):
    monkeypatch.setattr(decode, "verify_sampling", inverted_verify_sampling)
    target, static_target, static_draft, prompt = sampling_setup
    exact = exact_joint(target, prompt, temperature=1.0, top_p=1.0)
    counts, _, _ = empirical_joint(static_target, factory("draft", static_draft), prompt, temperature=1.0, top_p=1.0)
    assert min(pair_p_values(counts, exact)) < P_MIN


# --- EAGLE-3 on the compiled path: the target's aux states come out of its compiled step ----------------------


@pytest.fixture(scope="module")
def eagle3_setup():
    from eagle3_tiny import AUX_LAYERS, tiny_examples, tiny_target, trained_head

    target = tiny_target()
    examples = tiny_examples(target)
    head, _ = trained_head(target, examples=examples)
    prompt = examples[0].tokens[: examples[0].prompt_tokens].tolist()  # one the head was trained on
    static = StaticModel(target, capacity=len(prompt) + MAX_NEW + BUCKETS[-1], aux_layers=AUX_LAYERS)
    static.warm_up(range(1, 7))  # gamma <= 5
    return target, head, prompt, static


def test_compiled_eagle3_drafts_what_the_eager_one_does_without_recompiling(eagle3_setup):
    from specbench.decoding.eagle3 import Eagle3Proposer

    target, head, prompt, static = eagle3_setup
    expected = generate(target, BaselineProposer(DEVICE), prompt, gamma=1, temperature=0.0, max_new_tokens=MAX_NEW)
    graphs = counters["stats"]["unique_graphs"]
    for gamma in (1, 3, 5):
        eager = generate(target, Eagle3Proposer(head, target, device=DEVICE), prompt, gamma=gamma, temperature=0.0,
                         max_new_tokens=MAX_NEW)
        compiled = generate(static, Eagle3Proposer(head, target, device=DEVICE, aux=static), prompt, gamma=gamma,
                            temperature=0.0, max_new_tokens=MAX_NEW)
        assert compiled.output_ids == eager.output_ids == expected.output_ids, gamma
        assert compiled.accepted_per_position == eager.accepted_per_position, gamma  # the same drafts, step by step
        assert 0 < compiled.accepted_tokens < compiled.drafted_tokens, "the test needs accepted and rejected drafts"
        check_accounting(compiled, gamma=gamma)
    assert counters["stats"]["unique_graphs"] == graphs, "a step compiled a new graph after the warm-up"


def test_a_head_reading_other_layers_than_the_compiled_step_keeps_is_refused(eagle3_setup):
    from specbench.decoding.eagle3 import Eagle3Proposer

    target, head, _, _ = eagle3_setup

    def hooks() -> int:
        return sum(len(module._forward_pre_hooks) for module in target.modules())

    before = hooks()
    other = StaticModel(target, capacity=64, compile=False, aux_layers=(0, 1, 2))
    assert hooks() == before + 3
    with pytest.raises(ValueError, match=re.escape("the target keeps auxiliary states of layers [0, 1, 2], the "
                                                   "EAGLE-3 head 'eagle3' reads layers [1, 2, 4]")):
        Eagle3Proposer(head, target, device=DEVICE, aux=other)
    other.close()
    assert hooks() == before  # close() took its hooks off


@pytest.mark.parametrize("backend", ["hf", "server"])
def test_compile_on_another_backend_is_refused_in_one_line(tmp_path, backend):
    server = '[server]\nengine = "vllm"\n' if backend == "server" else ""
    (tmp_path / "p.toml").write_text(f'name = "p"\nbackend = "{backend}"\n{server}[target]\nmodel = "m"\n'
                                     '[sweep]\ngamma = [2]\ntemperature = [0.0]\n[workload]\nprompts = "builtin:mixed"\n'
                                     'max_new_tokens = 8\n[run]\ncompile = true\n')
    result = CliRunner().invoke(app, ["run", str(tmp_path / "p.toml")])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'p.toml'}: run.compile: compiles the native backend's steps; backend \"{backend}\" runs "
        "its own (remove it or use --no-compile)")
    assert not (tmp_path / "results").exists()


def test_a_cpu_verify_compiles_frozen_a_one_token_step_not_and_a_gpu_step_with_cuda_graphs(monkeypatch):
    """Inductor reads `freezing` while it compiles, at the compiled function's first call per shape: it must be on
    then for steps of 3 tokens or more (a 4-token verify costs 1.1x a 1-token step frozen, 1.5x not, on this CPU)
    and off for 1 and 2 (~8 % faster unfrozen); torch.compile's own `options` did not apply it."""
    from specbench.decoding import static

    seen = []

    def fake_compile(step, **settings):
        return lambda input_ids: seen.append((settings.get("mode"), input_ids.shape[-1],
                                              torch._inductor.config.freezing))

    monkeypatch.setattr(torch, "compile", fake_compile)
    for tokens in (1, 2, 3, 4, 9):
        static._compiled(lambda x: x, graphs=False)(torch.zeros((1, tokens)))
    static._compiled(lambda x: x, graphs=True)(torch.zeros((1, 4)))
    static._compiled(lambda x: x, graphs=False, freeze=False)(torch.zeros((1, 4)))
    assert seen == [(None, 1, False), (None, 2, False), (None, 3, True), (None, 4, True), (None, 9, True),
                    ("reduce-overhead", 4, False), (None, 4, False)]
    assert torch._inductor.config.freezing is False  # only while the step compiles


def test_a_frozen_graph_serves_only_its_own_models_weights():
    """Freezing folds the weights into the graph as constants: two models of one architecture compiled in one
    process (a target and a same-shaped draft) must each get their own logits at every bucket, frozen or not."""
    target = tiny_llama()
    draft = perturbed(target, scale=0.5)
    statics = [StaticModel(model, capacity=CAPACITY) for model in (target, draft)]
    for static in statics:
        static.warm_up(range(1, 5))  # buckets 1 and 2 unfrozen, 4 frozen
    ids = torch.tensor([PROMPT[:6]], device=DEVICE)
    with torch.inference_mode():
        for model, static in zip((target, draft), statics):
            for tokens in (1, 2, 4):
                static.begin(len(PROMPT), rolls_back=True)
                static.prefill(ids[:, :2])
                expected = model(input_ids=ids[:, : 2 + tokens]).logits[0, 2:]
                torch.testing.assert_close(static.forward(ids[:, 2 : 2 + tokens]), expected, atol=1e-4, rtol=1e-4)
    assert statics[0].frozen and statics[1].frozen


def test_frozen_graphs_must_fit_in_half_the_free_memory():
    """Each frozen bucket keeps a prepacked copy of its model's weights (~550 MiB a bucket for 513 MiB measured):
    a 7B fp32 target's five verify buckets (140 GB) would not fit a 64 GiB host, the embedded model's do."""
    gib = 2**30
    assert freeze_refusal([(513 * 2**20, 3), (130 * 2**20, 2)], 20 * gib) is None
    assert freeze_refusal([(4 * gib, 5)], 40 * gib) is None  # 20 GiB: exactly half
    refusal = freeze_refusal([(28 * gib, 5)], 64 * gib)
    assert refusal == ("frozen graphs would hold 140.0 GiB (a copy of the weights per step bucket), more than 50% of "
                       "the 64.0 GiB available: compiled without freezing")
    assert freeze_refusal([(28 * gib, 5)], None) is None  # unknown: frozen, as measured to pay here


def test_a_run_too_large_to_freeze_compiles_unfrozen_and_says_so(tmp_path, models_dir, monkeypatch):
    """The decision is the run's (every model alike, so the verify curve and the points decode on one kind of
    graph), and the manifest says which kind and why."""
    from specbench.backends import native

    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, profile=tiny_profile(gamma=(3,), temperature=(0.0,), repeats=1),
                  prompts=[("the cat sat on the mat and the dog ran fast", "chat")], models=models_dir)
    for free, kind in ((None, "frozen"), (1024, "unfrozen")):  # unknown free memory, then 1 KiB
        monkeypatch.setattr(native, "available_bytes", lambda device: free)
        result = CliRunner().invoke(app, ["run", "tiny.toml", "--compile", "--out", kind])
        assert result.exit_code == 0, result.output
        assert (pd.read_parquet(tmp_path / kind / "points.parquet")["kv_cache"] == "static").all()
        compiled = json.loads((tmp_path / kind / "manifest.json").read_text())["compile"]
        modes = {role: entry["mode"] for role, entry in compiled["models"].items()}
        if kind == "frozen":  # gamma 3 verifies 4 tokens; the draft's 1- and 2-token steps never freeze
            assert modes == {"target": "inductor, frozen at 4 tokens", "draft close": "inductor"}
            assert "freeze_refusal" not in compiled
        else:
            assert modes == {"target": "inductor", "draft close": "inductor"}
            assert re.fullmatch(r"frozen graphs would hold [\d.]+ MiB \(a copy of the weights per step bucket\), more "
                                r"than 50% of the 0\.0 MiB available: compiled without freezing",
                                compiled["freeze_refusal"])


def test_a_compiled_verify_curve_times_each_graph_once_per_width_it_serves_and_compiles_nothing():
    """k = 1..6 run four graphs (1, 2, 4, 6): 3 and 4 share one, 5 and 6 another. Each graph is timed at its widest
    width, twice as often where it serves two widths, and every width it serves reads its median."""
    from specbench.decoding.costs import verify_costs_ms

    static_target = StaticModel(perturbed(tiny_llama(), scale=0.1, seed=3), capacity=CAPACITY)  # its own graphs
    static_target.warm_up(range(1, 7))
    widths: list[int] = []
    forward = static_target.forward
    static_target.forward = lambda input_ids, **kw: widths.append(input_ids.shape[1]) or forward(input_ids, **kw)
    graphs = counters["stats"]["unique_graphs"]
    try:
        costs = verify_costs_ms(static_target, max_tokens=6, context_tokens=8, repeats=3)
    finally:
        del static_target.forward
    # the timing feeds the graphs the warm-up compiled (a tensor made outside inference mode recompiled them all)
    assert counters["stats"]["unique_graphs"] == graphs, "timing the curve compiled new graphs"
    assert sorted(set(widths)) == [1, 2, 4, 6]
    assert {k: widths.count(k) for k in (1, 2, 4, 6)} == {1: 1 + 3, 2: 1 + 3, 4: 1 + 6, 6: 1 + 6}  # warm-up + timed
    assert costs[2] == costs[3] and costs[4] == costs[5] and len(costs) == 6


def test_a_step_fed_a_tensor_made_outside_inference_mode_compiles_nothing_new():
    static_target = StaticModel(perturbed(tiny_llama(), scale=0.1, seed=4), capacity=CAPACITY)
    static_target.warm_up(range(1, 3))
    graphs = counters["stats"]["unique_graphs"]
    ids = torch.tensor([PROMPT[:4]], device=DEVICE)  # a normal tensor, one bucket wide: passed through unpadded
    with torch.inference_mode():
        static_target.begin(len(PROMPT), rolls_back=True)
        static_target.prefill(ids[:, :2])
        static_target.forward(ids[:, :2])
    assert counters["stats"]["unique_graphs"] == graphs
