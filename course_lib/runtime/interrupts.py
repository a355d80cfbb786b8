"""Interrupts a notebook can press at any moment: an import they cannot cut in half, and the
one-line KeyboardInterrupt that the launcher and ``%ranks`` raise. Pure standard library.

``course_lib`` imports torch on first use (``course_lib.launch``, ``%ranks start``,
``unit.run``), in the kernel's main thread, which takes 1-3 s. An interrupt (the notebook's ■)
that arrived during that import raised KeyboardInterrupt inside torch's own module code: torch
stayed half-imported in ``sys.modules``, and every later launch failed ("partially initialized
module 'torch'", "Only a single TORCH_LIBRARY can be used") until the kernel was restarted.
:func:`import_whole` records SIGINT while the import runs and honours it once the import is
complete, so the interrupted cell stops and the next one finds torch whole.
"""

from __future__ import annotations

import importlib
import signal
import threading
from types import FrameType, ModuleType

__all__ = ["Interrupted", "import_whole"]


class Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt raised once everything it stopped is cleaned up: the notebook shows
    its message in one line instead of the stack of the code the interrupt happened to land in."""

    def _render_traceback_(self) -> list[str]:
        return [
            f"KeyboardInterrupt: {self.args[0] if self.args else 'the cell was interrupted on every rank'}"
        ]


Interrupted.__name__ = Interrupted.__qualname__ = "KeyboardInterrupt"  # what the notebook names


def import_whole(name: str) -> ModuleType:
    """``importlib.import_module(name)``, with SIGINT held until the import is complete.

    An interrupt that arrives meanwhile is passed to the handler it was meant for once the
    module is imported (so ``Interrupted`` is raised where that handler raises
    KeyboardInterrupt). Outside the main thread, or where SIGINT has no Python handler (ignored,
    or the default action), the import runs as usual.
    """
    if threading.current_thread() is not threading.main_thread():
        return importlib.import_module(name)
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL, or a handler not installed from Python
        return importlib.import_module(name)
    held: list[FrameType | None] = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    try:
        module = importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        try:
            previous(signal.SIGINT, held[0])
        except KeyboardInterrupt:
            raise Interrupted(
                f"interrupted while importing {name} (and torch with it); the import was "
                "finished first, so the next call works"
            ) from None
    return module
