"""Prompt sets: builtin sets and user JSONL/CSV files."""

CATEGORIES: tuple[str, ...] = (
    "multi_turn", "code", "summarization", "translation", "qa", "math", "rag",
)
BUILTIN_SETS: tuple[str, ...] = ("mixed", *CATEGORIES)
