"""Unit 18: failures and checkpoints at scale (notebooks/18_failures_and_checkpoints.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
