"""Unit 10: ZeRO and FSDP (notebooks/10_zero_fsdp.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
