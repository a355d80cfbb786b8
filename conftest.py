# nbval: compare every cell tagged NBVAL_CHECK_OUTPUT (nbval itself only knows the metadata tag as
# "nbval-check-output"), and exercises' check cells against the solution outputs kept in their
# metadata (course.expected_outputs), not the "expected once your answer is right" text they show.
pytest_plugins = ["course_lib.grading.nbval_targets"]
