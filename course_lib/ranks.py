"""Persistent ranks in a notebook: ``%load_ext course_lib.ranks``, then run cells on N live processes.

Introduced in notebooks/08_collectives.ipynb ("step through a ring all-reduce")::

    %load_ext course_lib.ranks
    %ranks start 4                  # 4 ranks, process group ready; `rank`, `world_size` defined
    %%ranks                         # a cell on every rank; state persists between cells
    t = torch.full((4,), 2.0 ** rank)
    dist.all_reduce(t)
    t                               # [rank r] Out: tensor([15., 15., 15., 15.]), in rank order
    %%ranks 0,2                     # only ranks 0 and 2 (no collective on the world here!)
    from course_lib import ranks
    ranks.gather("t")               # the ranks' values, back in the kernel, in rank order
    ranks.push(lr=0.1)              # a kernel value into every rank (by cloudpickle)
    %ranks timeout 30               # every later cell's deadline, in seconds (default 60)
    %ranks stop                     # or %ranks restart (a fresh set of the same size)

Options: ``%ranks start N [--backend auto|gloo|nccl] [--timeout S] [--threads T]``;
``%%ranks [RANKS] [--timeout S]`` with RANKS like ``0,2`` or ``1-3`` (default: all).

Each rank starts with ``rank``, ``world_size``, ``torch``, ``dist`` and ``device`` (its
``rank_device()``) defined; a notebook value of one of these names (``rank = 0`` in a kernel
cell, ``ranks.push(rank=0)``) never replaces the rank's own: it is refused in one line. The kernel's own imports, functions, classes and literal constants
from cells it has run follow into the ranks before each ``%%ranks`` cell; other variables do
not (``ranks.push`` them): see ``runtime/_definitions.py`` for what can't be carried and why.

Output: each rank's stdout, then the value of its last expression (``[rank r] Out: ...``), rank
by rank in rank order (stderr likewise, to the cell's stderr). The guarantees (a deadline on every
cell; a rank that raises named with its traceback while the others keep their state; a dead
rank reported with its signal; "interrupt kernel" stopping every rank within ~1 s; nothing left
after a kernel restart) are those of :class:`course_lib.runtime.rankset.RankSet`.
"""

from __future__ import annotations

import atexit
import shlex
from typing import TYPE_CHECKING, Any

from course_lib.runtime import cells
from course_lib.runtime._definitions import definitions
from course_lib.runtime.cells import RanksError, RanksUsageError
from course_lib.runtime.errors import LaunchError
from course_lib.runtime.interrupts import Interrupted, import_whole

if TYPE_CHECKING:
    from course_lib.runtime.rankset import RankSet
    from course_lib.runtime.replies import RankReply

__all__ = ["RanksError", "RanksUsageError", "current", "gather", "push"]

_HELP = (
    "%ranks start N [--backend B] [--timeout S] [--threads T] | %ranks stop | "
    "%ranks restart | %ranks timeout S | %ranks status"
)


class _Session:
    """The kernel's one set of ranks and what has been sent to it."""

    def __init__(self) -> None:
        self.rankset: RankSet | None = None
        self.options: dict[str, Any] = {}
        self.defined: list[tuple[str, str, str]] = []  # (label, source, filename), in run order
        self.sent: dict[int, int] = {}  # rank -> how many of ``defined`` it has received
        self.cells = 0  # %%ranks cells run (names their tracebacks' file)
        self.kernel_cells = 0  # kernel cells recorded
        self.latest: dict[str, str] = {}  # label -> the last source recorded for it
        self.noted: set[str] = set()


_session = _Session()


def _usage(message: str) -> RanksUsageError:
    return RanksUsageError(message)


# ----------------------------------------------------------------------------- Python API


def current():
    """The running :class:`~course_lib.runtime.rankset.RankSet` (RuntimeError if none)."""
    rs = _session.rankset
    if rs is None or not rs.alive:
        if rs is not None and rs.ended:
            raise RanksUsageError(
                f"no ranks are running ({rs.ended}): %ranks restart starts a fresh "
                f"set of {rs.world_size} (their state is lost), or %ranks start N"
            )
        raise RanksUsageError(
            "no ranks are running: start them first with %ranks start 4 "
            "(after %load_ext course_lib.ranks)"
        )
    return rs


def gather(expression: str, ranks=None, *, timeout: float | None = None) -> list:
    """Evaluate ``expression`` (a str) on each rank and return the values as a list in rank order."""
    if not isinstance(expression, str):
        raise TypeError(
            f"expression = {expression!r}: expected a str to evaluate on each rank, "
            "e.g. ranks.gather('t')"
        )
    rs = current()
    selected = rs.check_ranks(ranks)
    try:
        values = rs.gather(expression, selected, definitions=_pending(selected), timeout=timeout)
    except LaunchError as exc:
        unpicklable = [t for t in exc.failures.values() if t.startswith("raised Unpicklable")]
        if unpicklable and len(unpicklable) == len(exc.failures):
            message = unpicklable[0].split(": ", 1)[1].splitlines()[0]
            raise RanksUsageError(
                f"ranks.gather: {message} (on ranks {sorted(exc.failures)})"
            ) from None
        raise RanksError(str(exc), exc.failures) from None
    for rank in selected:
        _session.sent[rank] = len(_session.defined)
    return values


def push(ranks=None, **values) -> None:
    """Define each ``name=value`` in the ranks (all, or ``ranks``); values travel by cloudpickle."""
    if not values:
        raise TypeError("values = {}: expected name=value pairs, e.g. ranks.push(lr=0.1)")
    rs = current()
    try:
        rs.push(values, ranks)
    except (TypeError, ValueError) as exc:  # a rank-defined name, or a value that cannot travel
        raise RanksUsageError(f"ranks.push: {exc}") from None


def _pending(ranks) -> dict[int, list]:
    """The kernel definitions each of ``ranks`` has not received yet."""
    return {r: _session.defined[_session.sent.get(r, 0) :] for r in ranks}


def _mark_sent(replies: dict[int, RankReply]) -> None:
    for rank, reply in replies.items():
        if reply.status in ("ok", "error"):  # the definitions ran (an interrupted cell resends)
            _session.sent[rank] = len(_session.defined)


# ----------------------------------------------------------------------------- magics


def _parse_ranks(text: str) -> list[int]:
    out: list[int] = []
    try:
        for part in text.split(","):
            first, dash, last = part.strip().partition("-")
            out += range(int(first), int(last) + 1) if dash else [int(first)]
    except ValueError:
        raise _usage(
            f"ranks = {text!r}: expected rank numbers like 0,2 or a range like 1-3 (%%ranks 0,2)"
        ) from None
    return out


def _options(tokens: list[str], allowed: dict) -> tuple[list[str], dict]:
    """Split ``--name value`` options (converted by ``allowed[name]``) from positional tokens."""
    positional, options = [], {}
    it = iter(tokens)
    for token in it:
        if token.startswith("--"):
            name = token[2:]
            if name not in allowed:
                raise _usage(
                    f"unknown option {token}: expected one of "
                    f"{', '.join('--' + n for n in allowed)}"
                )
            value = next(it, None)
            try:
                options[name] = allowed[name](value)
            except (TypeError, ValueError):
                raise _usage(
                    f"{token} {value}: expected a value, e.g. {token} "
                    f"{ {'timeout': 30, 'threads': 1}.get(name, 'gloo') }"
                ) from None
        else:
            positional.append(token)
    return positional, options


def _start(args: list[str]) -> None:
    positional, options = _options(args, {"backend": str, "timeout": float, "threads": int})
    if len(positional) != 1:
        raise _usage("%ranks start needs the number of ranks, e.g. %ranks start 4")
    try:
        n = int(positional[0])
    except ValueError:
        raise _usage(
            f"N = {positional[0]!r}: expected a number of ranks, e.g. %ranks start 4"
        ) from None
    if n <= 0:
        raise _usage(f"N = {n}: expected a number of ranks >= 1, e.g. %ranks start 4")
    if _session.rankset is not None and _session.rankset.alive:
        raise _usage(
            f"{_session.rankset.world_size} ranks are already running: %ranks stop "
            "first, or %ranks restart for a fresh set of the same size"
        )
    kwargs = {
        "backend": options.get("backend", "auto"),
        "timeout": options.get("timeout", 60.0),
        "threads_per_rank": options.get("threads", 1),
    }
    interrupted = Interrupted(f"%ranks start {n} was interrupted; no rank was left running")
    try:  # a cold start imports torch first: whole, even if interrupted meanwhile
        rankset = import_whole("course_lib.runtime.rankset")
    except KeyboardInterrupt:
        raise interrupted from None
    try:
        rs: RankSet = rankset.RankSet(n, **kwargs)
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    _session.rankset = None
    try:
        rs.start()
    except KeyboardInterrupt:
        raise interrupted from None
    _session.rankset, _session.options, _session.sent = rs, {"n": n, **kwargs}, {}
    _session.noted.clear()
    print(
        f"{n} ranks running ({rs.backend}), started in {rs.start_seconds:.2f} s; "
        f"`rank` and `world_size` are defined in each. Cell timeout {rs.timeout:g} s."
    )


def _stop() -> None:
    rs = _session.rankset
    if rs is not None:
        rs.stop()


def _restart() -> None:
    if not _session.options:
        raise _usage("%ranks restart: no set was started in this kernel; use %ranks start 4")
    _stop()
    o = _session.options
    _start(
        [
            str(o["n"]),
            "--backend",
            o["backend"],
            "--timeout",
            str(o["timeout"]),
            "--threads",
            str(o["threads_per_rank"]),
        ]
    )


def _set_timeout(args: list[str]) -> None:
    rs = current()
    try:
        from course_lib import validate

        rs.timeout = validate.number("timeout", float(args[0]), positive=True, maximum=86400.0)
    except (IndexError, ValueError) as exc:
        raise _usage(f"%ranks timeout needs seconds > 0, e.g. %ranks timeout 30 ({exc})") from None
    _session.options["timeout"] = rs.timeout
    print(f"cell timeout: {rs.timeout:g} s")


def ranks_line(line: str) -> None:
    """%ranks start N | stop | restart | timeout S | status (see the module docstring)."""
    try:
        tokens = shlex.split(line)
    except ValueError as exc:
        raise _usage(f"%ranks {line}: {exc}; usage: {_HELP}") from None
    if not tokens:
        raise _usage(f"%ranks needs a subcommand: {_HELP}")
    command, args = tokens[0], tokens[1:]
    if command == "start":
        _start(args)
    elif command == "stop":
        was = _session.rankset is not None and _session.rankset.alive
        _stop()
        print("ranks stopped" if was else "no ranks were running")
    elif command == "restart":
        _restart()
    elif command == "timeout":
        _set_timeout(args)
    elif command == "status":
        rs = _session.rankset
        print(
            f"{rs.world_size} ranks running ({rs.backend}), cell timeout {rs.timeout:g} s"
            if rs is not None and rs.alive
            else f"no ranks running{f' ({rs.ended})' if rs is not None and rs.ended else ''}"
        )
    else:
        raise _usage(f"unknown subcommand {command!r}: {_HELP}")


def ranks_cell(line: str, cell: str) -> None:
    """%%ranks [RANKS] [--timeout S]: run the cell on every rank, or on RANKS (e.g. 0,2 or 1-3)."""
    positional, options = _options(shlex.split(line), {"timeout": float})
    if len(positional) > 1:
        raise _usage(f"%%ranks {line}: expected at most one list of ranks, e.g. %%ranks 0,2")
    selected = _parse_ranks(positional[0]) if positional else None
    rs = current()
    try:
        selected = rs.check_ranks(selected)
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    _session.cells += 1
    try:
        replies = rs.run(
            cell,
            selected,
            definitions=_pending(selected),
            timeout=options.get("timeout"),
            filename=f"<ranks cell {_session.cells}>",
        )
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    except RuntimeError as exc:  # a rank died between cells: the set was stopped
        raise RanksError(str(exc), {}) from None
    _mark_sent(replies)
    cells.show(replies, _session.noted)
    cells.raise_for(replies, rs)


# ----------------------------------------------------------------------------- the extension


def _record_definitions(code: str) -> None:
    _session.kernel_cells += 1
    for item in definitions(code, f"<kernel cell {_session.kernel_cells}>"):
        label, source, _ = item
        if _session.latest.get(label) != source:  # the same definition run again: nothing new
            _session.latest[label] = source
            _session.defined.append(item)


def _record_modules(namespace: dict) -> None:
    """Carry the modules the kernel has imported so far under their names (``tp`` for
    ``from course_lib.parallel import tensor as tp``). The history replay above misses them when
    the front end runs cells without storing history (nbval, nbclient's store_history=False)."""
    import types

    lines = [
        f"import {value.__name__} as {name}"
        for name, value in namespace.items()
        if isinstance(value, types.ModuleType)
        and not name.startswith("_")
        and value.__name__ != "__main__"
    ]
    for line in lines:
        if _session.latest.get(line) != line:
            _session.latest[line] = line
            _session.defined.append((line, line, "<kernel namespace>"))


def _post_run_cell(result) -> None:
    if result.error_before_exec is not None or result.error_in_exec is not None:
        return
    raw = result.info.raw_cell if result.info is not None else ""
    if raw.lstrip().startswith("%%"):
        return  # a cell magic's body is not kernel code
    from IPython import get_ipython

    ip = get_ipython()
    try:
        _record_definitions(ip.transform_cell(raw))
    except Exception:  # a cell IPython itself cannot transform again: nothing to carry
        pass


def load_ipython_extension(ip) -> None:
    """``%load_ext course_lib.ranks``: register %ranks / %%ranks and follow the kernel's cells."""
    ip.register_magic_function(ranks_line, magic_kind="line", magic_name="ranks")
    ip.register_magic_function(ranks_cell, magic_kind="cell", magic_name="ranks")
    history = ip.user_ns.get("In", [])
    for code in history[1 : ip.execution_count]:  # cells run before the extension was loaded
        _record_definitions(code)
    _record_modules(ip.user_ns)
    if _post_run_cell not in ip.events.callbacks["post_run_cell"]:
        ip.events.register("post_run_cell", _post_run_cell)
    atexit.register(_stop)  # a kernel shutdown ends the ranks (the lifeline would, too)


def unload_ipython_extension(ip) -> None:
    _stop()
    try:
        ip.events.unregister("post_run_cell", _post_run_cell)
    except ValueError:
        pass
