"""The profile's [target] table: the model every point verifies with."""

from __future__ import annotations

from pydantic import model_validator

from specbench.profile.fields import Quantize, Table
from specbench.profile.references import ModelReference, is_trained_head
from specbench.profile.validation import rule


class TargetSpec(Table):
    model: ModelReference
    quantize: Quantize | None = None

    @model_validator(mode="after")
    def _not_a_head(self) -> "TargetSpec":
        if is_trained_head(self.model):
            raise rule("trained:... names an EAGLE-3 head for a draft, not a target (set a model)", at=("model",))
        return self
