"""Measurement: memory (MemoryMeter), timing, communication, and every formula (estimate)."""
from course_lib.measure import estimate  # noqa: F401
