"""Unit 03: Reduced and mixed precision (notebooks/03_mixed_precision.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
