"""Tiny random Llama-style models built from a config: fast, offline, deterministic.

SPECBENCH_TEST_DEVICE=cuda puts them (and the engine tests that use DEVICE) on a GPU."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

DEVICE = torch.device(os.environ.get("SPECBENCH_TEST_DEVICE", "cpu"))


def tiny_llama(
    *, vocab_size: int = 64, layers: int = 2, hidden: int = 64, seed: int = 0, init_std: float = 0.02
) -> LlamaForCausalLM:
    """A larger init_std gives peaked next-token distributions (random models are otherwise near uniform)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=init_std,
    )
    return LlamaForCausalLM(config).to(DEVICE).eval()


def perturbed(model: LlamaForCausalLM, *, scale: float, seed: int = 1) -> LlamaForCausalLM:
    """A draft that agrees with `model` often but not always: its weights plus Gaussian noise."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator).to(parameter.device))
    return draft


def resized_vocab(model: LlamaForCausalLM, vocab_size: int) -> LlamaForCausalLM:
    """The same network with a larger or smaller embedding matrix (padded rows are very unlikely tokens)."""
    draft = copy.deepcopy(model)
    old = draft.get_output_embeddings().weight.shape[0]
    draft.resize_token_embeddings(vocab_size, mean_resizing=False)
    if vocab_size > old:
        with torch.no_grad():
            draft.get_output_embeddings().weight[old:] = 0.0
            draft.get_output_embeddings().weight[old:, 0] = -100.0
    return draft.eval()


WORDS = (
    "<unk> <eos> <pad> the a an of to in on and or is are was be it this that with for as at by from "
    "cat dog mat sat ran fast slow red blue green big small one two three four five six seven eight nine "
    "ten code test model draft token speed fast? why how what when where who please write explain sum"
).split()


def word_tokenizer(words: tuple[str, ...] | list[str] = WORDS):
    """A word-level tokenizer over `words` (unknown words map to <unk>), no chat template."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", pad_token="<pad>")


def reindexed(model: LlamaForCausalLM, words: list[str], draft_words: list[str], *, scale: float = 0.0,
              seed: int = 5, aliases: dict[str, str] | None = None) -> LlamaForCausalLM:
    """A draft over another vocabulary, `draft_words` (ids in its own order): the target's network with each shared
    word's embedding and output rows moved to the word's draft id, random rows for words the target lacks (or the
    rows of the target word `aliases` names for it: the draft then splits that word's mass with it), plus Gaussian
    noise of `scale`. It agrees with the target wherever the target's choice is a shared word."""
    aliases = aliases or {}
    draft = copy.deepcopy(model)
    draft.resize_token_embeddings(len(draft_words), mean_resizing=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for source, dest in ((model.get_input_embeddings().weight, draft.get_input_embeddings().weight),
                             (model.get_output_embeddings().weight, draft.get_output_embeddings().weight)):
            for j, word in enumerate(draft_words):
                known = word if word in words else aliases.get(word)
                row = source[words.index(known)] if known is not None else \
                    source.std() * torch.randn(source.shape[1], generator=generator).to(source.device)
                dest[j] = row
    draft.config.vocab_size = len(draft_words)
    return perturbed(draft, scale=scale, seed=seed) if scale else draft.eval()


def write_model_folder(folder, model: LlamaForCausalLM, tokenizer=None):
    """A local Hugging Face folder (config, safetensors, tokenizer) that `specbench run` can load."""
    model.config.eos_token_id = 1
    model.config.pad_token_id = 2
    model.generation_config.eos_token_id = 1
    model.save_pretrained(folder)
    (tokenizer or word_tokenizer()).save_pretrained(folder)
    return folder


def write_model_pair(folder: Path) -> Path:
    """folder/target (a tiny model over WORDS) and folder/draft (its near copy): the tiny project's models."""
    target = tiny_llama(vocab_size=len(WORDS))
    write_model_folder(folder / "target", target)
    write_model_folder(folder / "draft", perturbed(target, scale=0.01))
    return folder


def write_project(folder: Path, *, profile: str, prompts: list[tuple[str, str]], models: Path | None = None) -> Path:
    """A folder `specbench run` and `tune` work in: tiny.toml, prompts.jsonl (prompt, category) and the
    model pair (links into `models`, written by write_model_pair, or written here)."""
    folder.mkdir(parents=True, exist_ok=True)
    if models is None:
        write_model_pair(folder)
    else:
        for name in ("target", "draft"):
            (folder / name).symlink_to(models / name)
    (folder / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": text, "category": category}) + "\n" for text, category in prompts))
    (folder / "tiny.toml").write_text(profile)
    return folder


def tiny_profile(*, gamma: tuple[int, ...] = (2, 3), temperature: tuple[float, ...] = (0.0, 0.8),
                 max_new_tokens: int = 16, repeats: int = 2, warmup: int = 1,
                 ngram: tuple[int, int] | None = None) -> str:
    """The tiny project's profile (tiny.toml): the target, an n-gram draft (with `ngram` = (min, max) if given)
    and the near-copy draft model, over `gamma` x `temperature`."""
    ngram_keys = f"ngram_min = {ngram[0]}\nngram_max = {ngram[1]}\n" if ngram else ""
    return (
        '\nname = "tiny"\n[target]\nmodel = "./target"\n'
        f'[[drafts]]\nname = "ngram"\nmethod = "ngram"\n{ngram_keys}'
        '[[drafts]]\nname = "close"\nmethod = "draft"\nmodel = "./draft"\n'
        f"[sweep]\ngamma = [{', '.join(map(str, gamma))}]\ntemperature = [{', '.join(map(str, temperature))}]\n"
        f'[workload]\nprompts = "prompts.jsonl"\nmax_new_tokens = {max_new_tokens}\n'
        f"[run]\nrepeats = {repeats}\nwarmup = {warmup}\n"
    )
