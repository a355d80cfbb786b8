"""Unit 00: Start here (notebooks/00_start_here.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
