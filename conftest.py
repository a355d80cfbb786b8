# nbval compares exercises' check cells with the solution outputs stored in their metadata
# (course.expected_outputs), not with the "expected once your answer is right" text they show.
pytest_plugins = ["course_lib.grading.nbval_targets"]
