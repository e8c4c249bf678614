"""Profile validation rules and their one-line errors: value checks usable in pydantic annotations, and a
pydantic error rendered as `key: what it must be (got value)`."""

from __future__ import annotations

import json
from typing import Any, get_args

from pydantic import AfterValidator, BaseModel
from pydantic_core import PydanticCustomError


# --- value rules -------------------------------------------------------------------------


URL_PATTERN = r"https?://[^\s/]+(:\d+)?/?"  # a server's address: scheme, host and port, no path


def show(value: Any) -> str:
    """A value as the user would write it in TOML (strings in double quotes), kept short."""
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def rule(message: str, *, at: tuple[str, ...] = ()) -> PydanticCustomError:
    """An error with our own message; `at` names the key when raised by a whole-model check."""
    return PydanticCustomError("profile_rule", message, {"at": at})


def check(is_valid, requirement: str) -> AfterValidator:
    def validate(value):
        if not is_valid(value):
            raise rule(f"must be {requirement} (got {show(value)})")
        return value

    return AfterValidator(validate)


def converted(convert, errors: type[Exception] = ValueError) -> AfterValidator:
    """The value as `convert` returns it; an `errors` it raises (a one-line message) becomes the key's error."""
    def validate(value):
        try:
            return convert(value)
        except errors as error:
            raise rule(str(error)) from None

    return AfterValidator(validate)


def distinct_values(values: tuple) -> tuple:
    if not values:
        raise rule("must list at least one value (got [])")
    if len(set(values)) != len(values):
        raise rule(f"must not repeat a value (got {show(values)})")
    return values


# --- pydantic errors -> one line ---------------------------------------------------------

_EXPECTED_TYPE = {
    "int_type": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a table",
    "dict_type": "a table",
}


def _dotted(loc: tuple) -> str:
    """('drafts', 0, 'model') -> 'drafts[0].model'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (model := _inner_model(arg)) is not None:
            return model
    return None


def _model_at(loc: tuple, root: type[BaseModel]) -> type[BaseModel] | None:
    """The schema class a location points into (list indices step into their items)."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, str) and model is not None:
            field = model.model_fields.get(part)
            model = _inner_model(field.annotation) if field else None
    return model


def describe(error: dict, *, root: type[BaseModel]) -> str:
    """One pydantic error of a `root` model as one line: the dotted key and what it must be."""
    loc = tuple(error["loc"]) + tuple(error.get("ctx", {}).get("at", ()))
    key, kind = _dotted(loc), error["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1], root)
        known = ", ".join(parent.model_fields) if parent else "none"
        return f"unknown key '{key}' (known: {known})"
    if kind == "missing":
        if _model_at(loc, root) is not None:
            return f"{key}: missing (add a [{key}] table)"
        return f"{key}: missing (add {loc[-1]} = ...)"
    if kind == "profile_rule":
        return f"{key}: {error['msg']}"
    if kind in _EXPECTED_TYPE:
        return f"{key}: must be {_EXPECTED_TYPE[kind]} (got {show(error['input'])})"
    if kind == "literal_error":
        return f"{key}: must be {error['ctx']['expected']} (got {show(error['input'])})"
    return f"{key}: {error['msg']}"
