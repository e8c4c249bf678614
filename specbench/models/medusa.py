"""Medusa heads in vLLM's format: the network, its config.json, load, save and the check against a target.

The format (vLLM 0.32, `model_executor/models/medusa.py`, `transformers_utils/configs/medusa.py`): config.json with
`"model_type": "medusa"`, `"architectures": ["MedusaModel"]`, `hidden_size`, `vocab_size`, `num_heads`,
`num_hidden_layers` (residual blocks per head), `truncated_vocab_size` and `medusa_fc_bias`; tensors
`blocks.{h}.layers.{l}.weight` [H, H] (and `.bias` with medusa_fc_bias) and `lm_heads.{h}.weight` [V, H]. Head h
reads the target's final hidden state (after its last norm) at position p and proposes the token at p + 2 + h: a block
x + SiLU(W x + b) per layer, then its own LM head; vLLM drafts each head's top-1.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specbench.models.errors import HeadError

ARCHITECTURE = "MedusaModel"
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


class ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, layers: int, *, bias: bool):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(hidden_size, hidden_size, bias=bias) for _ in range(layers)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHeads(nn.Module):
    def __init__(self, *, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, bias: bool = True):
        super().__init__()
        self.hidden_size, self.vocab_size, self.num_heads, self.num_layers, self.bias = (
            hidden_size, vocab_size, num_heads, num_layers, bias)
        self.blocks = nn.ModuleList([ResidualBlock(hidden_size, num_layers, bias=bias) for _ in range(num_heads)])
        self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(num_heads)])

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """[..., H] final hidden states -> [heads, ..., V] logits, head h for the token 2 + h positions on."""
        used = range(self.num_heads if heads is None else min(heads, self.num_heads))
        return torch.stack([self.lm_heads[h](self.blocks[h](hidden)) for h in used])

    @classmethod
    def from_target(cls, target: nn.Module, *, num_heads: int, num_layers: int = 1) -> "MedusaHeads":
        """Medusa's own initialisation: every LM head a copy of the target's, every block zero (so each head starts by
        proposing what the target would after the position it reads)."""
        lm_head = target.get_output_embeddings().weight  # [V, H]
        heads = cls(hidden_size=lm_head.shape[1], vocab_size=lm_head.shape[0], num_heads=num_heads,
                    num_layers=num_layers).to(device=lm_head.device, dtype=torch.float32)
        with torch.no_grad():
            for head, block in zip(heads.lm_heads, heads.blocks):
                head.weight.copy_(lm_head.float())
                for layer in block.layers:
                    layer.weight.zero_()
                    layer.bias.zero_()
        return heads

    def config(self) -> dict:
        return {"architectures": [ARCHITECTURE], "model_type": "medusa", "hidden_size": self.hidden_size,
                "vocab_size": self.vocab_size, "num_heads": self.num_heads, "num_hidden_layers": self.num_layers,
                "truncated_vocab_size": self.vocab_size, "medusa_fc_bias": self.bias}


def save_medusa(heads: MedusaHeads, folder: Path) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(heads.config(), indent=2) + "\n")
    save_file({name: tensor.detach().contiguous().cpu() for name, tensor in heads.state_dict().items()},
              str(folder / WEIGHTS_FILE))
    return folder


def load_medusa(folder: Path, target: nn.Module, *, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> MedusaHeads:
    """The heads in `folder`, checked against `target` (its hidden size and vocabulary); HeadError in one line."""
    from safetensors.torch import load_file

    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as error:
        raise HeadError(f"{folder}: not a Medusa head folder ({CONFIG_FILE}: {error})") from None
    if config.get("model_type") != "medusa":
        raise HeadError(f"{folder}: {CONFIG_FILE} says model_type {config.get('model_type')!r}, not 'medusa'")
    hidden = target.get_output_embeddings().weight.shape[1]
    vocab = target.get_output_embeddings().weight.shape[0]
    if config.get("hidden_size") != hidden:
        raise HeadError(f"{folder}: the Medusa heads read hidden states of size {config.get('hidden_size')}, the "
                        f"target's are {hidden}: heads trained for another target (train them for this one: "
                        "specbench heads train --kind medusa)")
    if config.get("vocab_size") != vocab or config.get("truncated_vocab_size", vocab) != vocab:
        raise HeadError(f"{folder}: the Medusa heads propose over {config.get('vocab_size')} tokens, the target has "
                        f"{vocab} (a truncated vocabulary with a token_map is not run here)")
    count = config.get("num_heads")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise HeadError(f"{folder}: {CONFIG_FILE}: num_heads must be an integer >= 1 (got {count!r})")
    heads = MedusaHeads(hidden_size=hidden, vocab_size=vocab, num_heads=count,
                        num_layers=int(config.get("num_hidden_layers", 1)), bias=bool(config.get("medusa_fc_bias")))
    try:
        heads.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    except (OSError, RuntimeError) as error:
        raise HeadError(f"{folder}: {WEIGHTS_FILE}: {' '.join(str(error).split())[:300]}") from None
    return heads.to(device=device, dtype=dtype).eval()
