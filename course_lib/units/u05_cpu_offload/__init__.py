"""Unit 05: CPU offload (notebooks/05_cpu_offload.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
