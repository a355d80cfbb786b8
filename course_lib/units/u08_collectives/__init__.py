"""Unit 08: Collectives (notebooks/08_collectives.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
