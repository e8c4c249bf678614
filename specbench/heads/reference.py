"""A profile's `trained:PRESET` head as a folder: the head `specbench heads train` distils for the profile's target
with that preset's settings (`default`: its defaults; `quick`: its --quick), taken from the cache or distilled on
first use. The same cache as the command: a head trained by hand is the one a run finds, and the other way round.
The preset's settings are the command's own, seed included (not the profile's run.seed), so every profile with
this target shares one head."""

from __future__ import annotations

from collections.abc import Callable

from specbench.heads.distill import train_head
from specbench.heads.settings import QUICK, HeadReport, HeadSettings
from specbench.profile import Profile
from specbench.profile.references import TRAINED_PREFIX, is_trained_head

PRESETS = {"default": HeadSettings(), "quick": QUICK}  # keyed by references.TRAINED_PRESETS (tested)


class _Phases:
    """A `train_head` observer that says each phase and each quarter of it as one line (for a run's log)."""

    def __init__(self, say: Callable[[str], None]):
        self.say, self.name, self.total, self.done, self.told = say, "", 0, 0, 0

    def message(self, text: str) -> None:
        self.say(text)

    def phase(self, name: str, total: int) -> None:
        self.name, self.total, self.done, self.told = name, total, 0, 0
        self.say(f"  {name}: 0/{total}")

    def advance(self, amount: int = 1, *, note: str = "") -> None:
        self.done += amount
        quarter = 4 * self.done // max(self.total, 1)
        if quarter > self.told:
            self.told = quarter
            self.say(f"  {self.name}: {self.done}/{self.total}" + (f" ({note})" if note else ""))


def trained_head(reference: str, *, target: str, device: str, say: Callable[[str], None]) -> HeadReport:
    """The head `trained:PRESET` names for `target`: cached, or distilled now (minutes; said as it goes)."""
    preset = reference.removeprefix(TRAINED_PREFIX)
    settings = PRESETS[preset]
    flags = " --quick" if preset == "quick" else ""
    say(f"EAGLE-3 head {reference} for {target}: from the cache, else distilled now, once per machine "
        f"(as `specbench heads train --target {target}{flags}`)")
    report = train_head(target, settings=settings, observer=_Phases(say), device=device)
    agreement = ", ".join(f"{value:.1%}" for value in report.agreement)
    say(f"{'cached' if report.cached else 'trained'} head {report.folder}: held-out top-1 agreement at draft "
        f"positions 1..{len(report.agreement)}: {agreement}")
    return report


def head_folder_reference(reference: str, *, target: str, device: str, say: Callable[[str], None]) -> str:
    """`reference` as a head folder or hub id: a trained:PRESET resolved (training it if needed), others as given."""
    if not is_trained_head(reference):
        return reference
    return trained_head(reference, target=target, device=device, say=say).folder


def with_mtp_target(profile: Profile, *, say: Callable[[str], None]) -> Profile:
    """`profile` itself, or where it sets target.mtp = "trained:PRESET", the profile whose target is the MTP model
    `specbench heads train --kind mtp` makes of its target (cached, or distilled now: minutes, said as it goes). Every
    point of the run, the baseline's too, runs that model: its outputs are the target's (the same weights in MiMo's
    format), and a speedup divides like by like."""
    preset = profile.target.mtp
    if preset is None:
        return profile
    from specbench.heads.mtp import train_mtp  # torch and the trainer load only for an MTP target

    target, name = profile.target.model, preset.removeprefix(TRAINED_PREFIX)
    flags = " --quick" if name == "quick" else ""
    say(f"MTP model {preset} for {target}: from the cache, else distilled now, once per machine "
        f"(as `specbench heads train --kind mtp --target {target}{flags}`)")
    report = train_mtp(target, settings=PRESETS[name], observer=_Phases(say), device=profile.device)
    agreement = ", ".join(f"{value:.1%}" for value in report.agreement)
    say(f"{'cached' if report.cached else 'trained'} MTP model {report.folder}: held-out top-1 agreement of its layer "
        f"at draft positions 1..{len(report.agreement)}: {agreement}")
    return profile.model_copy(update={"target": profile.target.model_copy(update={"model": report.folder})})
