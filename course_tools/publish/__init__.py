"""Publishing the course: lecture slides (reveal.js) and a static site, both offline.

``python -m course_tools.publish tag notebooks/*.ipynb``   set the slide metadata by the rules
``python -m course_tools.publish slides [NN ...]``         static slides in build/slides/
``python -m course_tools.publish site [NN ...]``           the static site in build/site/
``python -m course_tools.publish assets``                  fetch the pinned JavaScript only
"""
