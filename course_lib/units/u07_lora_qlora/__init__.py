"""Unit 07: LoRA and QLoRA (notebooks/07_lora_qlora.ipynb)."""

from course_lib.units import unit_getattr

__getattr__ = unit_getattr(__name__)
