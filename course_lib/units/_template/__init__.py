"""Unit NN: TITLE (notebooks/NN_TOPIC.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
