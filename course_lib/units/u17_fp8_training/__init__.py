"""Unit 17: FP8 training (notebooks/17_fp8_training.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
