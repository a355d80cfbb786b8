"""Shared helpers for the runtime tests (imported by name; not a test module)."""

from __future__ import annotations

import psutil

from course_lib.runtime.launch import helper_pids


def rank_processes() -> list[psutil.Process]:
    """Descendants of this test process, except multiprocessing's long-lived helpers.

    The forkserver (kept warm on purpose so the next launch is fast) and the resource tracker
    are children of the caller by design; every rank is a child *of the forkserver*, so it is
    still listed here while it runs.
    """
    helpers = helper_pids()
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in helpers and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
