"""Test helper: the course's code compiled anew, "a learner who wrote the same code".

Kept out of the installed package on purpose: shipped beside the checks, it would let a learner
pass the course's own answer off as theirs (its code objects are new, so the reference watch of
``course_lib.grading.references`` does not recognise them).
"""

from __future__ import annotations

import importlib
import sys
import types


def rewritten(module_name: str):
    """A fresh copy of a course module, compiled anew from its source: "a learner who wrote the
    same code". Its functions and classes have new code objects, so the reference watch does not
    take them for the course's own; they call each other, not the originals. For tests of
    checks (a correct answer written by hand must pass), never for learners.

    The copy is registered as ``module_name + "__rewritten"`` and pickled by value, so it also
    travels to ranks started by :func:`course_lib.launch`.
    """
    import inspect

    import cloudpickle

    original = importlib.import_module(module_name)
    name = f"{module_name}__rewritten"
    if name in sys.modules:
        return sys.modules[name]
    copy = types.ModuleType(name)
    copy.__file__ = f"<rewritten {module_name}>"
    copy.__package__ = original.__package__  # relative imports resolve as in the original
    sys.modules[name] = copy  # dataclasses and typing look the module up by name
    try:
        exec(compile(inspect.getsource(original), copy.__file__, "exec"), copy.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    cloudpickle.register_pickle_by_value(copy)
    return copy
