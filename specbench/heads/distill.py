"""Distil an EAGLE-3 head for a target on a workload, saved in vLLM's format and cached like converted models
(`cache_dir()/heads/<key>/`, keyed by the target's identity, the workload and the settings)."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from pydantic import ValidationError

from specbench.decoding import devices
from specbench.heads.data import (IGNORE, Example, capture_examples, draft_vocabulary, greedy_continuations,
                                  split_held_out)
from specbench.heads.train import TrainSettings, agreement, fit, make_batches
from specbench.models.registry import cache_dir
from specbench.models.load import load_model, load_tokenizer
from specbench.heads.settings import HeadReport, HeadSettings
from specbench.models.errors import HeadError
from specbench.models.eagle3 import Eagle3Head, default_aux_layers, head_config, save_head
from specbench.profile.validation import describe
from specbench.workloads.build import build_workload

FORMAT_VERSION = 1
REPORT_FILE = "specbench_head.json"
SMOKE_TEST_PROMPTS = HeadSettings().max_prompts  # a head from this many prompts (the default) or fewer


class Observer(Protocol):
    def message(self, text: str) -> None: ...
    def phase(self, name: str, total: int) -> None: ...
    def advance(self, amount: int = 1, *, note: str = "") -> None: ...


def heads_dir() -> Path:
    return cache_dir() / "heads"


def head_key(target_identity: str, settings: HeadSettings, *, device: torch.device, dtype: torch.dtype) -> str:
    text = json.dumps({"format": FORMAT_VERSION, "target": target_identity, "settings": asdict(settings),
                       "device": device.type, "dtype": str(dtype)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def read_report(folder: Path) -> HeadReport:
    data = json.loads((folder / REPORT_FILE).read_text())
    data = {**data, "agreement": tuple(data["agreement"]), "agreement_untrained": tuple(data["agreement_untrained"]),
            "train_agreement": tuple(data["train_agreement"]), "losses": tuple(data["losses"])}
    return HeadReport(**{**data, "folder": str(folder), "cached": True})


def train_head(target: str, *, settings: HeadSettings, observer: Observer, device: str = "auto",
               fresh: bool = False) -> HeadReport:
    """The head for `target` under `settings`: from the cache (the target's weights are not loaded: its identity
    comes with its tokenizer), or distilled now and cached. A distillation's target is freed, and on CUDA the
    allocator's cache emptied, before this returns: an engine launched next finds the memory free."""
    folder, torch_device, dtype = cache_entry(target, settings, kind=None, device=device)
    if (note := smoke_test_note(settings)) is not None:
        observer.message(note)
    if not fresh and (folder / REPORT_FILE).is_file():
        return read_report(folder)
    report = _distil(target, settings=settings, observer=observer, torch_device=torch_device, dtype=dtype,
                     folder=folder)
    gc.collect()  # the target, its states and the optimizer went with _distil's frame; reference cycles too
    if torch_device.type == "cuda":
        torch.cuda.empty_cache()
    return report


def cache_entry(target: str, settings: HeadSettings, *, kind: str | None, device: str
                ) -> tuple[Path, torch.device, torch.dtype]:
    """Where the cache keeps what `kind` distils for `target` under `settings` (the EAGLE-3 head's: no prefix), keyed
    by the target's identity (its tokenizer's: no weights loaded), the settings, device and dtype; and that device
    and dtype. ValueError (HeadError) naming a setting that is out of range."""
    settings.check()
    torch_device = devices.resolve_device(device)
    dtype = devices.resolve_dtype("auto", torch_device)
    _, identity = load_tokenizer(target)  # the identity load_model reports
    key = head_key(identity, settings, device=torch_device, dtype=dtype)[:16]
    return heads_dir() / (f"{kind}-{key}" if kind else key), torch_device, dtype


def smoke_test_note(settings: HeadSettings) -> str | None:
    """What a head distilled from the default number of prompts or fewer is (None for more)."""
    if settings.max_prompts > SMOKE_TEST_PROMPTS:
        return None
    return (f"a head distilled from {settings.max_prompts} prompts is a smoke test of the pipeline, not what a "
            "published EAGLE-3 head accepts (those are trained on hundreds of thousands of conversations): for "
            "figures to deploy on, point model at a published head for the target, or train on far more prompts "
            "(--max-prompts)")


def _distil(target: str, *, settings: HeadSettings, observer: Observer, torch_device: torch.device,
            dtype: torch.dtype, folder: Path) -> HeadReport:
    """Distil the head and cache it in `folder`; what it loads (the target first) goes when it returns."""
    started = time.perf_counter()
    observer.message(f"loading target {target}")
    loaded = load_model(target, device=torch_device, dtype=dtype)
    model, config = loaded.model, loaded.model.config
    if settings.draft_vocab_size > config.vocab_size:
        raise HeadError(f"--draft-vocab-size: {settings.draft_vocab_size} exceeds the target's vocabulary of "
                        f"{config.vocab_size} ids (use at most that, or 0 for all of it)")
    layer_ids = default_aux_layers(config.num_hidden_layers)
    continuations, examples, seconds = target_examples(loaded, settings=settings, observer=observer,
                                                       torch_device=torch_device, layer_ids=layer_ids)
    train_ids, held_ids = split_held_out(len(examples), held_out=settings.held_out, seed=settings.seed)
    train_set, held_set = [examples[i] for i in train_ids], [examples[i] for i in held_ids]

    torch.manual_seed(settings.seed)
    head, to_draft, coverage = _new_head(model, train_set, held_set, settings=settings, layer_ids=layer_ids)
    head.to(torch_device)
    embed = frozen_embedding(model)
    lm_head_weight = (head.lm_head.weight if head.lm_head is not None
                      else model.get_output_embeddings().weight.detach().float())
    trained = fit_measured(head, train_set, held_set, settings=settings, to_draft=to_draft, embed=embed,
                           lm_head_weight=lm_head_weight, observer=observer, torch_device=torch_device)
    report = head_report(trained, folder=folder, target=target, loaded=loaded, settings=asdict(settings),
                         coverage=coverage, continuations=continuations, seconds=seconds, started=started,
                         torch_device=torch_device)
    _store(head, report, folder)
    return report


@dataclass(frozen=True)
class Trained:
    """What `fit_measured` did: the loss of every optimizer step, top-1 agreement per draft position (held out,
    untrained; held out, trained; on the training prompts), the seconds training took, and the example counts."""

    losses: list[float]
    untrained: tuple[float, ...]
    held_out: tuple[float, ...]
    train: tuple[float, ...]
    train_s: float
    examples: dict[str, int]


def fit_measured(head, train_set: list[Example], held_set: list[Example], *, settings: HeadSettings,
                 to_draft: torch.Tensor | None, embed, lm_head_weight: torch.Tensor, observer: Observer,
                 torch_device: torch.device, train_weight: torch.Tensor | None = None) -> Trained:
    """Train a head that drafts by the training-time test (an EAGLE-3 head, an MTP layer) on `train_set`, its
    agreement measured with `lm_head_weight` before and after; the loss over `train_weight`'s rows (default:
    `lm_head_weight`'s), the labels mapped by `to_draft`."""
    steps = settings.ttt_steps
    batch = {"batch_tokens": settings.batch_tokens, "steps": steps, "to_draft": to_draft, "device": torch_device}
    train_batches, held_batches = make_batches(train_set, **batch), make_batches(held_set, **batch)
    measure = {"embed": embed, "lm_head_weight": lm_head_weight, "steps": steps}
    untrained = agreement(head, held_batches, **measure)
    train = TrainSettings(epochs=settings.epochs, batch_tokens=settings.batch_tokens,
                          learning_rate=settings.learning_rate, ttt_steps=steps, seed=settings.seed)
    observer.phase("training", settings.epochs * len(train_batches))
    clock = time.perf_counter()
    losses = fit(head, train_batches, settings=train, embed=embed,
                 lm_head_weight=lm_head_weight if train_weight is None else train_weight,
                 on_step=lambda loss: observer.advance(note=f"loss {loss:.3f}"))
    devices.synchronize(torch_device)
    train_s = time.perf_counter() - clock
    examples = {"train_prompts": len(train_set), "held_out_prompts": len(held_set),
                "train_tokens": sum(e.length for e in train_set), "held_out_tokens": sum(e.length for e in held_set)}
    return Trained(losses, untrained, agreement(head, held_batches, **measure), agreement(head, train_batches, **measure),
                   train_s, examples)


def head_report(trained: Trained, *, folder: Path, target: str, loaded, settings: dict[str, Any], coverage: float,
                continuations: list[list[int]], seconds: dict[str, float], started: float,
                torch_device: torch.device) -> HeadReport:
    return HeadReport(
        folder=str(folder), target=target, target_identity=loaded.identity, settings=settings,
        device=str(torch_device), agreement=trained.held_out,
        agreement_untrained=trained.untrained, train_agreement=trained.train, draft_vocab_coverage=coverage,
        losses=(trained.losses[0], trained.losses[-1]),
        examples={**trained.examples, "generated_tokens": sum(len(c) for c in continuations)},
        seconds={**seconds, "train": trained.train_s, "total": time.perf_counter() - started},
    )


def target_examples(loaded, *, settings: HeadSettings, observer: Observer, torch_device: torch.device,
                    layer_ids: list[int]) -> tuple[list[list[int]], list[Example], dict[str, float]]:
    """What every head kind is distilled from: the target's greedy continuations of the settings' prompts, then its
    hidden states at `layer_ids` over prompt + continuation (one Example per prompt), with the seconds of each."""
    model, config, tokenizer = loaded.model, loaded.model.config, loaded.tokenizer
    prompts = _prompt_ids(settings, tokenizer)
    seconds: dict[str, float] = {}
    observer.phase("greedy continuations", len(prompts))
    clock = time.perf_counter()
    eos = sorted({i for i in (tokenizer.eos_token_id, config.eos_token_id) if isinstance(i, int)})
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    continuations = greedy_continuations(model, prompts, max_new_tokens=settings.max_new_tokens, eos_token_ids=eos,
                                         pad_token_id=pad, batch_size=settings.generate_batch, on_batch=observer.advance)
    devices.synchronize(torch_device)
    seconds["generate"] = time.perf_counter() - clock

    observer.phase("target states", len(prompts))
    clock = time.perf_counter()
    examples = capture_examples(model, prompts, continuations, layer_ids=layer_ids, on_example=observer.advance)
    devices.synchronize(torch_device)
    seconds["capture"] = time.perf_counter() - clock
    return continuations, examples, seconds


def _prompt_ids(settings: HeadSettings, tokenizer) -> list[list[int]]:
    from specbench.profile import WorkloadSpec

    try:  # sampled four times over, then the prompts up to max_prompt_tokens kept
        spec = WorkloadSpec.model_validate({"prompts": settings.workload, "max_prompts": 4 * settings.max_prompts,
                                            "max_new_tokens": settings.max_new_tokens},
                                           context={"base_dir": Path.cwd()})
    except ValidationError as error:
        raise HeadError(f"--workload: {describe(error.errors()[0], root=WorkloadSpec)}") from None
    prompts = build_workload(spec, tokenizer, seed=settings.seed).prompt_ids
    return [ids for ids in prompts if len(ids) <= settings.max_prompt_tokens][: settings.max_prompts]


def _new_head(model, train_set, held_set, *, settings: HeadSettings, layer_ids) -> tuple[Eagle3Head, Any, float]:
    """A head shaped like the target's layers; its lm_head (if any) and final norm start from the target's."""
    config = model.config
    vocab = (draft_vocabulary(train_set, size=settings.draft_vocab_size, vocab_size=config.vocab_size)
             if settings.draft_vocab_size else None)
    head = Eagle3Head(head_config(config, draft_vocab_size=settings.draft_vocab_size or config.vocab_size,
                                  aux_layer_ids=layer_ids, norm_before_residual=settings.norm_before_residual),
                      own_lm_head=vocab is not None).float()
    with torch.no_grad():
        head.norm.weight.copy_(model.get_decoder().norm.weight.float().cpu())
        if vocab is None:
            return head, None, 1.0
        head.lm_head.weight.copy_(model.get_output_embeddings().weight[vocab.to(model.device)].float().cpu())
        head.d2t.copy_(vocab - torch.arange(vocab.shape[0]))
        head.t2d.zero_()
        head.t2d[vocab] = True
    to_draft = torch.full((config.vocab_size,), IGNORE, dtype=torch.long)
    to_draft[vocab] = torch.arange(vocab.shape[0])
    labels = torch.cat([e.labels[e.prompt_tokens : -1] for e in held_set]) if held_set else torch.empty(0)
    coverage = float(head.t2d[labels].float().mean()) if labels.numel() else float("nan")
    return head, to_draft, coverage


def frozen_embedding(model):
    weight = model.get_input_embeddings().weight.detach()
    return lambda ids: torch.nn.functional.embedding(ids, weight).float()


def _store(head: Eagle3Head, report: HeadReport, folder: Path) -> None:
    store_files(lambda tmp: save_head(head, tmp), report, folder)


def store_files(write, report: HeadReport, folder: Path) -> None:
    """`write(tmp)` the head and its report to a temporary folder, then move it into place (a concurrent run that
    finished first wins)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{folder.name}-", dir=folder.parent))
    try:
        write(tmp)
        data = {k: v for k, v in asdict(report).items() if k not in ("folder", "cached")}
        (tmp / REPORT_FILE).write_text(json.dumps(data, indent=1) + "\n")
        if folder.exists():
            shutil.rmtree(folder)  # --fresh: the new head replaces the old one
        os.rename(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_head(report: HeadReport, out: Path) -> Path:
    """The head's files (config, weights, report) copied to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for path in Path(report.folder).iterdir():
        shutil.copy2(path, out / path.name)
    return out


