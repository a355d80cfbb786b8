"""Unit 12: Pipeline parallelism (notebooks/12_pipeline_parallelism.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
