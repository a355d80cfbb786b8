"""Parallelism from scratch, a package per idea; each package's ``__init__`` is its front.

``collectives`` (unit 08), ``ddp`` (09), ``zero`` (10), ``tensor`` (11), ``pipeline`` (12),
``context`` (15), ``experts`` (16); ``mesh`` lays ranks out over dp x tp x pp (+ cp, ep) and
``harness`` checks a parallel run against one process.
"""
