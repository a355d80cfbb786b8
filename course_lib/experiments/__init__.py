"""course_lib.experiments"""
