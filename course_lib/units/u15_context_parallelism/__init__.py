"""Unit 15: Context parallelism (notebooks/15_context_parallelism.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
