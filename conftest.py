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
pytest_plugins = ["course_lib.grading.nbval_targets"]
