"""Unit 13: Interconnects and backends (notebooks/13_interconnects_and_backends.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
