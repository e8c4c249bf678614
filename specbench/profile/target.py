"""The profile's [target] table: the model every point verifies with, and (`mtp`) MTP layers made for it here."""

from __future__ import annotations

from pydantic import StrictStr, field_validator, model_validator

from specbench.profile.fields import Quantize, Table
from specbench.profile.references import TRAINED_PREFIX, TRAINED_PRESETS, ModelReference, is_trained_head
from specbench.profile.validation import rule, show


class TargetSpec(Table):
    model: ModelReference
    quantize: Quantize | None = None
    # "trained:PRESET": the target served as the MTP model `specbench heads train --kind mtp` makes of it (its weights
    # as they are in MiMo's format, plus one distilled MTP layer), distilled on first use and cached; every point of
    # the run, the baseline's too, then runs that model (specbench.heads.reference.with_mtp_target)
    mtp: StrictStr | None = None

    @field_validator("mtp")
    @classmethod
    def _mtp_preset(cls, value: str | None) -> str | None:
        if value is not None and value not in {TRAINED_PREFIX + preset for preset in TRAINED_PRESETS}:
            presets = " or ".join(f'"{TRAINED_PREFIX}{p}"' for p in TRAINED_PRESETS)
            raise rule(f"must be {presets}: the MTP layer `specbench heads train --kind mtp` distils with its defaults "
                       f"or --quick (got {show(value)}); a model with MTP layers of its own needs no mtp key")
        return value

    @model_validator(mode="after")
    def _not_a_head(self) -> "TargetSpec":
        if is_trained_head(self.model):
            raise rule("trained:... names an EAGLE-3 head for a draft, not a target (set a model)", at=("model",))
        if self.mtp is not None and self.quantize is not None:
            raise rule("an MTP model is served as it is written (remove quantize, or mtp)", at=("quantize",))
        return self
