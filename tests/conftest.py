import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the `tiny` helpers

from tiny import write_model_pair  # noqa: E402 - after the path is set

# Tiny models gain nothing from threads, and OpenMP spin-waits make them crawl when another process
# shares the two cores. Tests on the real model raise this where they need it.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    """The tiny target and its near-copy draft (tests/tiny.py), written once for the session."""
    return write_model_pair(tmp_path_factory.mktemp("models"))
