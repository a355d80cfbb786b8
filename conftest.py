"""Settings for every pytest run of the course (the library's tests and nbval over notebooks/).

One OpenMP/BLAS thread in every process a test starts (kernels, graders, zygotes, torchrun): the
suite runs two tests at a time on 2 cores, and two processes spinning 2 OpenMP threads each made a
training loop 5.7x slower (unit 03's loss curves: 5.8 s alone, 33 s each beside a second copy; 6 s
each with one thread). Set before any process starts; an OMP_NUM_THREADS of your own is kept.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

# nbval: compare every cell tagged NBVAL_CHECK_OUTPUT (nbval itself only knows the metadata tag as
# "nbval-check-output"), and exercises' check cells against the solution outputs kept in their
# metadata (course.expected_outputs), not the "expected once your answer is right" text they show.
pytest_plugins = ["course_tools.nbval_targets"]


# The longest modules of the library's tests (each one scope under --dist loadscope, 1-4 minutes of
# one worker; the wall's one batch of attackers and the answers probe are single fixtures): started
# first, so the last minutes are short modules on both workers.
LONG_MODULES = (
    "tests/browser/",
    "tests/test_course.py",
    "tests/cluster/",
    "tests/grading/test_wall.py",
    "tests/grading/test_answers_not_printed.py",
)


def pytest_collection_modifyitems(session, config, items):
    """The long modules first, and the lectures in reverse order (18 first): under ``--dist
    loadscope``/``loadfile`` each worker takes the next module or lecture when it finishes one, so
    the later units, which launch the most ranks, start first and the short early ones fill in at
    the end instead of one long module running alone."""
    from pathlib import Path

    root = Path(str(config.rootpath))

    def key(item) -> int:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb" and path.parent.name == "notebooks" and path.name[:2].isdigit():
            return -int(path.name[:2])
        where = path.relative_to(root).as_posix() if path.is_relative_to(root) else ""
        return -100 if where.startswith(LONG_MODULES) else 0

    items.sort(key=key)  # stable: the cells of a lecture and the tests of a module keep their order
