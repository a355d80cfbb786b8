"""Unit 06: Activation checkpointing (notebooks/06_activation_checkpointing.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
