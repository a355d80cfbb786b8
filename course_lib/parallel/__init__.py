"""course_lib.parallel"""
