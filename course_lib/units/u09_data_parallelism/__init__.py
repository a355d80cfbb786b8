"""Unit 09: Data parallelism (notebooks/09_data_parallelism.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
