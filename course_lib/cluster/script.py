"""Write a torchrun-ready script for an experiment, and the commands that run it.

``export(experiment, path, **settings)`` writes a short, self-contained Python file: it imports
course_lib (which must be installed on every node, as it is in the course's environment), holds
the reader's settings, and calls :func:`course_lib.cluster.main`. ``launch_command`` gives the
torchrun line for one node or several, ``slurm_script`` an ``sbatch`` file around it (both in
:mod:`course_lib.runtime.commands`, re-exported here).
"""

from __future__ import annotations

import os
import pathlib
import textwrap
from typing import Any

from course_lib.cluster.experiment import Experiment, get
from course_lib.runtime.commands import (  # noqa: F401 (re-exported by course_lib.cluster)
    DEFAULT_PORT,
    launch_command,
    slurm_script,
)

SCRIPT = '''\
#!/usr/bin/env python
"""{name}: {title}.

{summary}

One machine, {world_text}:
    {one_node}
Two nodes of {per_node} ranks (the same command on each node; HEAD_NODE = the first node):
    {two_nodes}
Without torchrun (course_lib.launch starts the ranks, as in the lecture):
    python {script} --world-size {plain_world}
A setting can be changed on the command line: {setting_example}
Back in a notebook:
    from course_lib import cluster
    from course_lib.units import {package} as unit
    res = cluster.load("{out}")  # res.value: the lecture's value; res.meta: the run
{plot_text}"""
from course_lib.cluster import main

EXPERIMENT = {name!r}
SETTINGS = {settings}
OUT = {out!r}

if __name__ == "__main__":
    # end_process: under torchrun, a rank whose run succeeded ends its process in main
    main(EXPERIMENT, SETTINGS, out=OUT, world_size={world_size!r}, end_process=True)
'''


def _shown_world_size(exp: Experiment, world_size: int | None, chosen: dict[str, Any]) -> int:
    """The world size the instructions show: the given one, or a valid one."""
    shown = world_size
    for candidate in (4, 2, exp.minimum):
        if shown is not None:
            break
        try:
            shown = exp.resolve_world_size(candidate, chosen)
        except ValueError:
            continue
    return shown or exp.minimum


def _setting_example(script: str, chosen: dict[str, Any]) -> str:
    example_key = next(iter(chosen), None)
    if example_key is None:
        return "(this experiment has no settings)"
    v = chosen[example_key]
    v = ",".join(map(str, v)) if isinstance(v, tuple) else v
    return f"python {script} --{example_key.replace('_', '-')} {v}"


def render(
    experiment: str | Experiment,
    *,
    script: str = "experiment.py",
    out: str | None = None,
    world_size: int | None = None,
    **settings: Any,
) -> str:
    """The text of the exported script (see :func:`export`)."""
    exp = get(experiment)
    chosen = exp.settings(settings)
    fixed = exp.world_size(chosen) if exp.world_size else None
    if world_size is not None or fixed is not None:
        world_size = exp.resolve_world_size(world_size, chosen)  # refused here, before any rank
    shown = _shown_world_size(exp, world_size, chosen)
    exp.check_run(shown, chosen)  # the unit's own rules, as the script applies them when it runs
    out = out or f"{pathlib.Path(script).stem}_results.json"
    per_node = max(1, shown // 2)
    setting_example = _setting_example(script, chosen)
    function = f"{exp.run.__module__}.{exp.run.__qualname__}"
    doc = " ".join((exp.run.__doc__ or "").split())
    summary = textwrap.fill(
        f"{doc} Every rank calls {function} with SETTINGS below, as {exp.lecture} does; rank 0 "
        f"writes the value to {out} (JSON). Exported by course_lib.cluster.",
        96,
        break_on_hyphens=False,
        break_long_words=False,
    )
    settings_text = (
        "{\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in chosen.items()) + "}" if chosen else "{}"
    )
    return SCRIPT.format(
        name=exp.name,
        title=exp.title,
        lecture=exp.lecture,
        out=out,
        script=script,
        package=exp.run.__module__.split(".")[2],
        world_text=f"{shown} ranks" + ("" if world_size else " (any valid world size)"),
        one_node=launch_command(script, nproc_per_node=shown),
        two_nodes=launch_command(script, nproc_per_node=per_node, nnodes=2)
        if shown % 2 == 0 and shown >= 2
        else "(needs an even world size)",
        per_node=per_node,
        plain_world=shown,
        summary=summary,
        setting_example=setting_example,
        plot_text=f"    {exp.plot}\n" if exp.plot else "",
        settings=settings_text,
        world_size=world_size,
    )


def export(
    experiment: str | Experiment,
    path: str | os.PathLike[str],
    *,
    out: str | None = None,
    world_size: int | None = None,
    **settings: Any,
) -> pathlib.Path:
    """Write a torchrun-ready script for ``experiment`` with ``settings`` to ``path``.

    ``experiment``: a name from :func:`course_lib.cluster.experiments` (``"u09.bytes"``) or a
    unit (``"u09"``, its first experiment). ``out``: the results file the script's rank 0
    writes (default: ``<script stem>_results.json``, next to where it runs). ``world_size``:
    checked now when given (a bad one is refused before any process starts) and used when the
    script runs without torchrun. Settings are checked now too; an unknown one is refused with
    the list of valid ones.
    """
    path = pathlib.Path(path)
    if path.suffix != ".py":
        raise ValueError(f"path = {str(path)!r}: expected a .py file")
    text = render(experiment, script=path.name, out=out, world_size=world_size, **settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
