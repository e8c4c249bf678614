"""Tiny EAGLE-3 heads for tiny targets: untrained, or distilled for a few seconds with specbench.heads; and saved
in the formats heads are published in (.bin weights, the speculators format)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tiny import DEVICE, tiny_llama

from specbench.heads.data import capture_examples, greedy_continuations
from specbench.heads.train import TrainSettings, fit, make_batches
from specbench.models.eagle3 import Eagle3Head, config_json, head_config, save_head
from specbench.models.eagle3_formats import EAGLE3_KEYS, WEIGHTS_FILE

AUX_LAYERS = (1, 2, 4)  # of a 5-layer target: an early, a middle and the last layer's input


def tiny_target(*, vocab_size: int = 64, seed: int = 2, init_std: float = 0.3):
    """A target with peaked distributions (its greedy text is not one repeated token)."""
    return tiny_llama(vocab_size=vocab_size, layers=5, hidden=64, seed=seed, init_std=init_std)


def untrained_head(target, *, seed: int = 0, draft_vocab: torch.Tensor | None = None) -> Eagle3Head:
    """A randomly initialised head; with `draft_vocab` (target ids, ascending) its own lm_head over them."""
    torch.manual_seed(seed)
    vocab_size = target.config.vocab_size
    config = head_config(target.config, draft_vocab_size=vocab_size if draft_vocab is None else len(draft_vocab),
                         aux_layer_ids=AUX_LAYERS)
    head = Eagle3Head(config, own_lm_head=draft_vocab is not None)
    if draft_vocab is not None:
        with torch.no_grad():
            head.d2t.copy_(draft_vocab - torch.arange(len(draft_vocab)))
            head.t2d.zero_()
            head.t2d[draft_vocab] = True
    return head.to(DEVICE).eval()


def random_prompts(count: int, *, vocab_size: int, seed: int, length: int = 12) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (length,), generator=generator).tolist() for _ in range(count)]


def tiny_examples(target, *, count: int = 24, max_new_tokens: int = 24, seed: int = 0):
    prompts = random_prompts(count, vocab_size=target.config.vocab_size, seed=seed)
    continuations = greedy_continuations(target, prompts, max_new_tokens=max_new_tokens,
                                         eos_token_ids=(target.config.eos_token_id,),
                                         pad_token_id=0, batch_size=8)
    return capture_examples(target, prompts, continuations, layer_ids=AUX_LAYERS)


def embedding_of(target):
    weight = target.get_input_embeddings().weight.detach()
    return lambda ids: torch.nn.functional.embedding(ids, weight).float()


def trained_head(target, *, epochs: int = 30, seed: int = 0, examples=None) -> tuple[Eagle3Head, list[float]]:
    """A head distilled on the target's continuations of random prompts (full vocabulary, target's lm_head)."""
    examples = examples if examples is not None else tiny_examples(target)
    head = untrained_head(target, seed=seed)
    batches = make_batches(examples, batch_tokens=512, steps=3, to_draft=None, device=DEVICE)
    settings = TrainSettings(epochs=epochs, batch_tokens=512, learning_rate=3e-3, ttt_steps=3, seed=seed)
    losses = fit(head, batches, settings=settings, embed=embedding_of(target),
                 lm_head_weight=target.get_output_embeddings().weight.detach())
    return head, losses


# --- a head in the formats heads are published in ----------------------------------------------------------

VERIFIER = "acme/tiny-verifier"  # the verifier a speculators head written here names


def save_bin(head: Eagle3Head, folder: Path) -> Path:
    """The head in vLLM's own format with its tensors in pytorch_model.bin (a plain state dict, as torch.save
    writes one) instead of model.safetensors."""
    save_head(head, folder)
    (folder / WEIGHTS_FILE).unlink()
    torch.save({name: tensor.detach().cpu() for name, tensor in head.state_dict().items()},
               folder / "pytorch_model.bin")
    return folder


def save_speculators(head: Eagle3Head, folder: Path, *, weights: str = "safetensors",
                     norm_before_residual: bool | None = None) -> Path:
    """The head as the speculators library saves an Eagle3Speculator: the layer's Llama config nested (as
    to_diff_dict writes it: keys at their LlamaConfig default left out; rope_theta, as published heads have it), the
    EAGLE-3 keys at the top (norm_before_residual left out where None), the proposal and the verifier in
    speculators_config, the layer's tensors named layers.0. rather than midlayer."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    own = config_json(head.config)
    layer = {key: value for key, value in own.items() if key not in EAGLE3_KEYS and key != "dtype"}
    layer = LlamaConfig(**{**layer, "architectures": ["LlamaForCausalLM"]}).to_diff_dict()
    rope = layer.pop("rope_parameters", None) or {}  # as transformers 4 wrote it, as published heads have it
    layer.update({"rope_theta": rope["rope_theta"]} if "rope_theta" in rope else {})
    if rope.get("rope_type", "default") != "default":
        layer["rope_scaling"] = {key: value for key, value in rope.items() if key != "rope_theta"}
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
              "draft_vocab_size": own["draft_vocab_size"], "target_hidden_size": None,
              "eagle_aux_hidden_state_layer_ids": own["eagle_aux_hidden_state_layer_ids"],
              "transformer_layer_config": layer,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                           "accept_tolerance": 0.0, "verifier_accept_k": 1}],
                                     "verifier": {"name_or_path": VERIFIER, "architectures": ["LlamaForCausalLM"]}}}
    if norm_before_residual is not None:
        config["norm_before_residual"] = norm_before_residual
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {name.replace("midlayer.", "layers.0.", 1): tensor.detach().cpu().contiguous()
               for name, tensor in head.state_dict().items()}
    if weights == "safetensors":
        save_file(tensors, str(folder / WEIGHTS_FILE))
    else:
        torch.save(tensors, folder / "pytorch_model.bin")
    return folder
