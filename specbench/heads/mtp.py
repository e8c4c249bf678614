"""An MTP layer distilled for a target from its own greedy continuations, as the EAGLE-3 head is (the same prompts,
continuations, held-out split, settings and cache), and the target made a MiMo model that carries it
(specbench.models.mtp): the model vLLM serves with `{"method": "mtp"}` and the native backend drafts from.

The layer reads the target's last hidden state before its final norm and the next token's embedding; it is trained
with the target frozen by the EAGLE-3 trainer's training-time test (`HeadSettings.ttt_steps` chained steps, each
reading the layer's own output of the step before), against the target's greedy token two positions on: the loss
over the draft vocabulary's rows of the lm_head (`--draft-vocab-size`, the ids the target chooses most, as the
EAGLE-3 head's; a CPU cannot afford 49,152 rows three times a token), the drafting and the agreement over all of
them. It starts from the target's last decoder layer and final norm (DeepSeek-V3's recipe). The cached folder is the
whole model: the target's weights, exactly (q/k/v biases zero where the target has none), plus the layer."""

from __future__ import annotations

import gc
import time
from dataclasses import asdict

import torch

from specbench.heads.data import IGNORE, draft_vocabulary, split_held_out
from specbench.heads.distill import (REPORT_FILE, Observer, cache_entry, fit_measured, frozen_embedding, head_report,
                                     read_report, store_files, target_examples)
from specbench.heads.settings import HeadReport, HeadSettings
from specbench.models.load import hf_folder, load_model
from specbench.models.mtp import check_convertible, new_layer, write_mtp_model

KIND = "mtp"


def train_mtp(target: str, *, settings: HeadSettings, observer: Observer, device: str = "auto",
              fresh: bool = False) -> HeadReport:
    """The MTP model for `target` under `settings`: from the cache, or distilled now and cached. Its folder
    (`report.folder`) is a model: point target.model at it, or write target.mtp = "trained:PRESET"."""
    folder, torch_device, dtype = cache_entry(target, settings, kind=KIND, device=device)
    if not fresh and (folder / REPORT_FILE).is_file():
        return read_report(folder)
    report = _distil(target, settings=settings, observer=observer, torch_device=torch_device, dtype=dtype,
                     folder=folder)
    gc.collect()
    if torch_device.type == "cuda":
        torch.cuda.empty_cache()
    return report


def _distil(target: str, *, settings: HeadSettings, observer: Observer, torch_device: torch.device,
            dtype: torch.dtype, folder) -> HeadReport:
    started = time.perf_counter()
    target_folder = hf_folder(target)  # a GGUF converted once: the weights the MTP model copies
    check_convertible(target_folder)  # before minutes of distillation
    observer.message(f"loading target {target}")
    loaded = load_model(target, device=torch_device, dtype=dtype)
    model = loaded.model
    layer_ids = [model.config.num_hidden_layers]  # the input of the final norm: what MiMoModel hands its MTP layer
    continuations, examples, seconds = target_examples(loaded, settings=settings, observer=observer,
                                                       torch_device=torch_device, layer_ids=layer_ids)
    train_ids, held_ids = split_held_out(len(examples), held_out=settings.held_out, seed=settings.seed)
    train_set, held_set = [examples[i] for i in train_ids], [examples[i] for i in held_ids]

    torch.manual_seed(settings.seed)
    layer = new_layer(model).to(torch_device)
    lm_head_weight = model.get_output_embeddings().weight.detach().float()
    # the loss over the draft vocabulary's rows of the lm_head only (the ids the target chooses most, as the EAGLE-3
    # head's): a training cost, not a drafting one (the layer drafts over the whole vocabulary); 0: all of it
    vocab, to_draft, coverage = _draft_vocabulary(train_set, held_set, size=settings.draft_vocab_size,
                                                  vocab_size=lm_head_weight.shape[0])
    trained = fit_measured(layer, train_set, held_set, settings=settings, to_draft=to_draft,
                           embed=frozen_embedding(model), lm_head_weight=lm_head_weight, observer=observer,
                           torch_device=torch_device,
                           train_weight=lm_head_weight[vocab.to(lm_head_weight.device)] if vocab is not None else None)
    report = head_report(trained, folder=folder, target=target, loaded=loaded,
                         settings={**asdict(settings), "kind": KIND}, coverage=coverage, continuations=continuations,
                         seconds=seconds, started=started, torch_device=torch_device)
    source = {"specbench_mtp": {"target": target, "target_identity": loaded.identity}}
    store_files(lambda tmp: write_mtp_model(target_folder, [layer.cpu()], tmp, extra=source), report, folder)
    return report


def _draft_vocabulary(train_set, held_set, *, size: int, vocab_size: int):
    """(ids, target id -> draft id, share of the held-out choices inside) of the `size` ids the target chooses most
    in training; (None, None, 1.0) for the whole vocabulary."""
    if not size or size >= vocab_size:
        return None, None, 1.0
    vocab = draft_vocabulary(train_set, size=size, vocab_size=vocab_size)
    to_draft = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    to_draft[vocab] = torch.arange(vocab.shape[0])
    labels = torch.cat([e.labels[e.prompt_tokens : -1] for e in held_set]) if held_set else torch.empty(0, dtype=torch.long)
    coverage = float((to_draft[labels] != IGNORE).float().mean()) if labels.numel() else float("nan")
    return vocab, to_draft, coverage
