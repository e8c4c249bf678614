"""Model references (builtin:NAME, hub id, local folder, .gguf file): resolve, fetch, load."""

BUILTIN_MODELS: dict[str, object] = {
    "smollm2-135m-instruct": None,
    "qwen2.5-coder-1.5b-instruct": None,
    "qwen2.5-coder-0.5b-instruct": None,
}
