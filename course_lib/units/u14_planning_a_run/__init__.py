"""Unit 14: Planning a real training run (notebooks/14_planning_a_run.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
