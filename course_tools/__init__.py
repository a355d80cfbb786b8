"""The maintainers' tools: what builds, checks and measures the course, never what a learner runs.

``course_lib`` is the learner's package (what a lecture, an exercise, the grader and a rank
import); this package sits above it, imports it, and is never imported by it
(``tests/test_import_graph.py``). Its commands, each behind a ``make`` target:

    python -m course_tools.publish site|slides|nav|tag   # make site, slides, notebooks
    python -m course_tools.exercises build|check         # make exercises, check-exercises
    python -m course_tools.execute NB [NB ...]           # make notebooks: stored outputs
    python -m course_tools.gpu_check [--out docs]        # make gpu-check: the CUDA paths
    python -m course_tools.bench launch|virtual|ranks    # course_lib's own machinery, timed
    python -m course_tools.new_unit NN TOPIC [TITLE]     # make new-unit: a unit's first files

``course_tools.nbval_targets`` is the pytest plugin the repository's ``conftest.py`` loads (nbval
compares the tagged cells, and an exercise's check cells with the solution's outputs).

What they need beyond the core is the ``tools`` extra (``pyproject.toml``), part of the
maintainer's install (``make test``).
"""
