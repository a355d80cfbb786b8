"""Unit 01: Backprop memory (notebooks/01_backprop_memory.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
