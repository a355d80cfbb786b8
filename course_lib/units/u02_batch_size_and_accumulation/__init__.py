"""Unit 02: Batch size and gradient accumulation (notebooks/02_batch_size_and_accumulation.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
