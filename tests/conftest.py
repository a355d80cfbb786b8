"""Suite-wide settings.

One intra-op thread per test process: the reference machine has 2 cores, and launched ranks
(one thread each) share them with the test process. Oversubscribed BLAS threads made single
training steps an order of magnitude slower under load.
"""

import signal
import sys
import warnings
from pathlib import Path

import matplotlib
import pytest
import torch

matplotlib.use("Agg")  # headless: plots are tested as Figures, never shown
torch.set_num_threads(1)


_SIGINT_AT_START = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def sigint_as_at_start(request):
    """Every test starts with the SIGINT handler the session started with (Python's, which raises
    KeyboardInterrupt, as in a notebook kernel). A test or a library that leaves SIGINT ignored
    would make a later test of Ctrl-C pass a launch through untouched: it is put back, and named."""
    yield
    if signal.getsignal(signal.SIGINT) is not _SIGINT_AT_START:
        signal.signal(signal.SIGINT, _SIGINT_AT_START)
        warnings.warn(
            f"{request.node.nodeid} left SIGINT's handler changed; restored", stacklevel=1
        )


@pytest.fixture(autouse=True)
def close_figures():
    """Every test starts without the figures an earlier test left open."""
    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


# Lanes (pyproject.toml lists the markers). A file's kind decides its marker here, in one place, so a
# new test in one of these files is in the right lane without a decorator. `make test-fast` runs
# what no marker selects; tests that are slow for another reason carry `pytest.mark.slow` themselves.
_LANES = {
    "browser": ("browser/",),
    "cluster": ("cluster/", "runtime/test_launch_torchrun.py"),
    # Files whose tests execute a notebook (nbclient, the grader) or drive a Jupyter kernel.
    "notebook": (
        "test_course.py",
        "grading/test_grader.py",
        "grading/test_batch.py",
        "grading/test_execute.py",
        "grading/test_course_references_refused.py",
        "runtime/test_launch_kernel_faults.py",
        "runtime/test_launch_notebook.py",
        "runtime/test_ranks_magic.py",
        "runtime/test_ranks_kernel_faults.py",
        "runtime/test_first_import_interrupt.py",
        "viz/test_widgets_kernel.py",
        "viz/test_plots.py::test_every_plot_cell_shows_its_figure_in_a_real_kernel",
    ),
}
_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(item.fspath).resolve()
        if not path.is_relative_to(_TESTS):
            continue  # a notebook collected by nbval
        rel = path.relative_to(_TESTS).as_posix() + "::" + item.nodeid.split("::", 1)[-1]
        for marker, prefixes in _LANES.items():
            if rel.startswith(prefixes):
                item.add_marker(getattr(pytest.mark, marker))
