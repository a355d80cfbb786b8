"""Unit 11: Tensor parallelism (notebooks/11_tensor_parallelism.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
