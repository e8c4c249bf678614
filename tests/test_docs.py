"""docs/profiles.md documents every profile key the schema has, and no key it does not have.

The page lists each TOML table under a heading `### [table]` (`### [[table]]` for an array of tables, `### top level`
for the keys outside any table) and, in the Markdown table under it, one key per row: the backticked name in the first
column. The schema's keys are read from the pydantic models, walked from the root `Profile`: a field whose type is a
model (or an optional one) is a table, a tuple or list of models an array of tables, anything else a key.
"""

import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel

from specbench.profile import Profile

PROFILES_MD = Path(__file__).resolve().parent.parent / "docs" / "profiles.md"
TOP_LEVEL = "top level"
TABLE_HEADING = re.compile(r"^###\s+(top level|\[\[[A-Za-z0-9_.]+\]\]|\[[A-Za-z0-9_.]+\])\s*$")
KEY_CELL = re.compile(r"^`([A-Za-z0-9_]+)`$")


def documented_keys(text: str) -> set[tuple[str, str]]:
    """(table, key) for every row of the key tables under the `### [table]` headings of `text`."""
    keys: set[tuple[str, str]] = set()
    table = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            match = TABLE_HEADING.match(stripped)
            table = match[1] if match else None  # any other heading ends the table's section
            continue
        if table is None or not stripped.startswith("|"):
            continue
        first_cell = stripped.strip("|").split("|")[0].strip()
        if match := KEY_CELL.match(first_cell):
            keys.add((table, match[1]))
    return keys


def _models_in(annotation) -> tuple[type[BaseModel] | None, bool]:
    """The model a field's annotation holds, if any, and whether it is an array of them (tuple/list of models):
    Optional, unions with None and Annotated wrappers are looked through."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        found = [_models_in(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        found = [item for item in found if item[0] is not None]
        return found[0] if found else (None, False)
    if origin in (tuple, list):
        args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
        if len(args) == 1:
            model, _ = _models_in(args[0])
            if model is not None:
                return model, True
        return None, False
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def _toml_name(name: str, field) -> str:
    """The key as a profile spells it: the field's alias where it has one."""
    for alias in (field.alias, field.validation_alias):
        if isinstance(alias, str):
            return alias
    return name


def schema_keys(model: type[BaseModel], path: str = "", array: bool = False) -> set[tuple[str, str]]:
    """(table, key) for every key `model` and the tables inside it take, `path` being its TOML path."""
    table = TOP_LEVEL if not path else (f"[[{path}]]" if array else f"[{path}]")
    keys: set[tuple[str, str]] = set()
    for name, field in model.model_fields.items():
        toml_name = _toml_name(name, field)
        inner, is_array = _models_in(field.annotation)
        if inner is None:
            keys.add((table, toml_name))
        else:
            keys |= schema_keys(inner, f"{path}.{toml_name}" if path else toml_name, is_array)
    return keys


def _listing(pairs: set[tuple[str, str]]) -> str:
    return ", ".join(f"{table} {key}" for table, key in sorted(pairs))


def test_profiles_md_documents_exactly_the_schema_keys():
    documented = documented_keys(PROFILES_MD.read_text(encoding="utf-8"))
    schema = schema_keys(Profile)
    undocumented = schema - documented
    unknown = documented - schema
    assert not undocumented, f"keys of the profile schema missing from docs/profiles.md: {_listing(undocumented)}"
    assert not unknown, f"keys in docs/profiles.md that the profile schema does not have: {_listing(unknown)}"


def test_the_parser_reads_headings_and_first_column_keys():
    text = "\n".join([
        "## Reference", "", "### top level", "", "| key | meaning |", "|---|---|", "| `name` | the folder |", "",
        "### [target]", "| key | default |", "|---|---|", "| `model` | required |", "| not a key | - |",
        "### [[drafts]]", "| `method` | a `ngram` mention later in the row is not a key |",
        "### Some other heading", "| `ignored` | not under a table heading |",
    ])
    assert documented_keys(text) == {("top level", "name"), ("[target]", "model"), ("[[drafts]]", "method")}


def test_the_page_and_the_schema_both_yield_keys():
    documented = documented_keys(PROFILES_MD.read_text(encoding="utf-8"))
    schema = schema_keys(Profile)
    for keys in (documented, schema):
        assert len(keys) >= 30
        assert ("[target]", "model") in keys
        assert ("[[drafts]]", "method") in keys
        assert ("[sweep]", "gamma") in keys
        assert (TOP_LEVEL, "name") in keys
    assert not any(key in {"target", "drafts", "sweep", "server"} for _, key in schema), \
        "tables must not be counted as keys"
