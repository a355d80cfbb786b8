"""Unit 19: Inside the step (notebooks/19_inside_the_step.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
