"""What every table of the profile shares: the base model (strict, frozen, unknown keys refused), the one-line
`ProfileError`, and the value types used by several tables."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Strict, StrictInt, StrictStr

from specbench.core.errors import OneLineError
from specbench.profile.validation import check, distinct_values


class ProfileError(OneLineError, ValueError):
    """A profile that cannot be used; the message is always a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.splitlines()))


class Table(BaseModel):
    """A TOML table of the profile: unknown keys are errors, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


PositiveInt = Annotated[StrictInt, check(lambda v: v >= 1, "an integer >= 1")]
PositiveFloat = Annotated[float, Strict(), check(lambda v: v > 0, "a number > 0")]
NonNegativeInt = Annotated[StrictInt, check(lambda v: v >= 0, "an integer >= 0")]
NonNegativeFloat = Annotated[float, Strict(), check(lambda v: v >= 0, "a number >= 0")]
Share = Annotated[float, Strict(), check(lambda v: 0 < v <= 1, "a number in (0, 1]")]
Temperature = Annotated[float, Strict(), check(lambda v: v >= 0, "a number >= 0")]
TopP = Annotated[float, Strict(), check(lambda v: 0 < v <= 1, "a number in (0, 1]")]
FolderName = Annotated[
    StrictStr,
    check(
        lambda v: re.fullmatch(r"(?!\.+$)[A-Za-z0-9._-]+", v) is not None,
        "usable as a folder name: letters, digits, '.', '_' or '-'",
    ),
]

Axis = AfterValidator(distinct_values)  # the values of a sweep axis: no value twice
OutputBudget = Annotated[Any, check(lambda v: v == "dataset" or (type(v) is int and v >= 1),
                                    'an integer >= 1 or "dataset"')]
Quantize = Literal["int8"]
