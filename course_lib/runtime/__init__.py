"""course_lib.runtime"""
