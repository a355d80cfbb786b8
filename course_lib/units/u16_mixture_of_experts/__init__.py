"""Unit 16: Mixture of experts (notebooks/16_mixture_of_experts.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
