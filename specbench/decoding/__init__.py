"""Speculative decoding in this process: the native (instrumented) decoder and the Hugging Face reference.

"Engine" in specbench means an external serving engine (vLLM, SGLang, llama.cpp: specbench.engines); this
package is the decoding the in-process backends (native, hf) run.
"""
