"""Suite-wide settings.

One intra-op thread per test process: the reference machine has 2 cores, and launched ranks
(one thread each) share them with the test process. Oversubscribed BLAS threads made single
training steps an order of magnitude slower under load.
"""

import sys

import matplotlib
import pytest
import torch

matplotlib.use("Agg")  # headless: plots are tested as Figures, never shown
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def close_figures():
    """Every test starts without the figures an earlier test left open."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")
