"""course_lib.techniques"""
