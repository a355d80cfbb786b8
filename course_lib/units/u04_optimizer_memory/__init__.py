"""Unit 04: Optimizer memory (notebooks/04_optimizer_memory.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
