"""course_lib.viz"""
