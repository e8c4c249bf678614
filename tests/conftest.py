import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # tests import the `tiny` helpers

# Tiny models gain nothing from threads, and OpenMP spin-waits make them crawl when another process
# shares the two cores. Tests on the real model raise this where they need it.
torch.set_num_threads(1)
