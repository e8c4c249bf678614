"""`specbench heads train`: distil an EAGLE-3 head for a target (a thin command over `train_head`)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from specbench.cli.common import fail
from specbench.ui.console import console, print_note
from specbench.core.errors import OneLineError
from specbench.heads.settings import QUICK, HeadSettings
from specbench.profile import load_profile
from specbench.ui.heads import HeadProgress, print_head_report

heads_app = typer.Typer(help="Draft heads (EAGLE-3, Medusa) and MTP layers: distil them for a target, in vLLM's format.",
                        no_args_is_help=True)

DEFAULTS = HeadSettings()


def _model_reference(reference: str) -> str:
    """A path (./x, /x, ~/x, x.gguf, or an existing folder) made absolute, as a profile resolves it; builtin:NAME
    and hub ids as given."""
    path = Path(reference).expanduser()
    if not (reference.startswith((".", "/", "~")) or reference.endswith(".gguf") or path.is_dir()):
        return reference
    if not path.exists():
        fail(f"--target: not found: {path.resolve()}")
    return str(path.resolve())


@heads_app.command("train")
def train(
    profile: Annotated[Optional[Path], typer.Argument(help="A profile: its target, device and run.seed (and its workload's prompts unless --workload).")] = None,
    target: Annotated[Optional[str], typer.Option(help="The target model (builtin:NAME, folder, .gguf or hub id); overrides the profile's.")] = None,
    workload: Annotated[Optional[str], typer.Option(help=f"Prompts the target continues: builtin:SET, .jsonl/.csv or ShareGPT .json (default: the profile's, else {DEFAULTS.workload}).")] = None,
    max_prompts: Annotated[Optional[int], typer.Option(help=f"Prompts to distil on, held-out ones included (default {DEFAULTS.max_prompts}).")] = None,
    max_prompt_tokens: Annotated[Optional[int], typer.Option(help=f"Skip prompts longer than this (default {DEFAULTS.max_prompt_tokens}).")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help=f"Greedy tokens generated per prompt (default {DEFAULTS.max_new_tokens}).")] = None,
    epochs: Annotated[Optional[int], typer.Option(help=f"Passes over the training tokens (default {DEFAULTS.epochs}).")] = None,
    draft_vocab_size: Annotated[Optional[int], typer.Option(help=f"The head's own lm_head over the most chosen ids (d2t/t2d); 0: the target's lm_head (default {DEFAULTS.draft_vocab_size}).")] = None,
    ttt_steps: Annotated[Optional[int], typer.Option(help=f"Draft positions unrolled in training and evaluated (default {DEFAULTS.ttt_steps}).")] = None,
    held_out: Annotated[Optional[float], typer.Option(help=f"Share of the prompts kept out of training (default {DEFAULTS.held_out}).")] = None,
    learning_rate: Annotated[Optional[float], typer.Option(help=f"Peak AdamW learning rate (default {DEFAULTS.learning_rate}).")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of the split, the initialisation and the batch order (default: the profile's run.seed, else 0).")] = None,
    device: Annotated[Optional[str], typer.Option(help="auto, cpu, cuda or cuda:N (default: the profile's, else auto).")] = None,
    kind: Annotated[str, typer.Option(help="eagle3 (a one-layer EAGLE-3 head), medusa (Medusa heads: --ttt-steps heads, each drafting one position further) or mtp (the target as a MiMo model with one MTP layer, chained --ttt-steps deep in training).")] = "eagle3",
    quick: Annotated[bool, typer.Option("--quick", help=f"A small head for CI: {QUICK.max_prompts} prompts, {QUICK.max_new_tokens} tokens each, {QUICK.epochs} epochs (a few minutes on a CPU).")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Train again even if the cache holds this head.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also copy the head's folder here.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
) -> None:
    """Distil a one-layer EAGLE-3 head (--kind eagle3), Medusa heads (medusa) or an MTP layer (mtp: the target
    written as a MiMo model that carries it) from the target's greedy continuations (target frozen, training-time
    test over the draft positions); report held-out top-1 agreement per position; cache it in vLLM's format."""
    from specbench.heads.distill import copy_head, train_head  # torch loads only when a head is trained
    from specbench.heads.medusa import train_medusa
    from specbench.heads.mtp import train_mtp

    trainers = {"eagle3": train_head, "medusa": train_medusa, "mtp": train_mtp}
    if kind not in trainers:
        fail(f"--kind: eagle3, medusa or mtp (got {kind!r})")
    try:
        loaded = load_profile(profile) if profile is not None else None
        if target is None and loaded is None:
            fail("give a PROFILE or --target MODEL (the model the head drafts for)")
        base = QUICK if quick else DEFAULTS
        given = {"workload": workload or (loaded.workload.prompts if loaded else None), "max_prompts": max_prompts,
                 "max_prompt_tokens": max_prompt_tokens, "max_new_tokens": max_new_tokens, "epochs": epochs,
                 "draft_vocab_size": draft_vocab_size, "ttt_steps": ttt_steps, "held_out": held_out,
                 "learning_rate": learning_rate,
                 "seed": seed if seed is not None else (loaded.run.seed if loaded else None)}
        settings = replace(base, **{key: value for key, value in given.items() if value is not None})
        model = _model_reference(target) if target is not None else loaded.target.model
        out_console = console(stderr=json_output)
        with HeadProgress(out_console) as progress:
            report = trainers[kind](model, settings=settings, observer=progress,
                             device=device or (loaded.device if loaded else "auto"), fresh=fresh)
        if out is not None:
            copy_head(report, out)
    except OneLineError as error:
        fail(str(error))
    print_head_report(out_console, report)
    if out is not None:
        print_note(out_console, f"copied to {out}")
    if json_output:
        sys.stdout.write(json.dumps(asdict(report), indent=2) + "\n")
