"""Execute notebooks in place and save them with their outputs (``make notebooks``).

    python -m course_tools.execute notebooks/03_mixed_precision.ipynb [more.ipynb ...] [--timeout 300]

Each notebook runs top to bottom in a fresh ``python3`` kernel (nbclient) whose working directory is
the notebook's own directory, so relative paths behave as in JupyterLab. The kernel imports the same
``course_lib`` as this command. Stored output is made as deterministic as possible: execution counts
restart at 1, nbclient's per-cell timing metadata is not recorded (and old timing metadata is
removed), widget state is not stored (its model ids are random), and the file is written with
nbformat's canonical JSON (sorted keys, indent=1) plus a trailing newline.

If a cell raises, the notebook is NOT overwritten (unless ``--allow-errors``) and the command names
the notebook, the cell index and the exception, then goes on with the next notebook; it exits 1 if
any notebook failed, 2 for a missing or unreadable file.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from pathlib import Path
from typing import Any

from course_lib.grading.kernels import kernel_env, make_client

__all__ = ["ExecuteError", "execute_notebook"]

DEFAULT_TIMEOUT = 600.0  # seconds per cell; lecture notebooks run in about a minute in total


class ExecuteError(RuntimeError):
    """A notebook could not be executed; the message names the notebook and the cell."""


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _strip_timing(nb: Any) -> None:
    for cell in nb.cells:
        meta = cell.get("metadata", {})
        for key in ("execution", "ExecuteTime"):
            meta.pop(key, None)


def _kernel_metadata(nb: Any, client: Any, kernel_name: str) -> None:
    """Store what JupyterLab itself writes when it opens the notebook on this kernel (the
    kernelspec's display name, the kernel's full language_info), so opening a notebook does not
    mark it modified and saving it makes no diff (on the same Python version)."""
    from jupyter_client.kernelspec import KernelSpecManager

    reply = client.wait_for_reply(client.kc.kernel_info())
    info = (reply or {}).get("content", {}).get("language_info")
    if info:
        nb.metadata["language_info"] = info
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except Exception:  # noqa: BLE001 - a kernel started by name always has a spec; keep the old one
        return
    nb.metadata["kernelspec"] = {
        "display_name": spec.display_name,
        "language": spec.language,
        "name": kernel_name,
    }


_TQDM_TEXT = re.compile(r"<[^>]+>")


def _finish_progress_bars(nb: Any) -> None:
    """Give each stored tqdm progress bar the text of its final state.

    A tqdm bar in a notebook is a widget (an HBox of label, bar and counts); the text fallback a
    page without the widget state shows is the one captured when the bar appeared: "0% 0/7". The
    widget state at the end of the run holds the final label and counts; put those in the text.
    """
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {})

    def value(model_id: str) -> str:
        text = models.get(model_id, {}).get("state", {}).get("value", "")
        return (
            html.unescape(_TQDM_TEXT.sub("", str(text)))
            .replace("\xa0", " ")
            .replace("\u2007", " ")
            .strip()
        )

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).get("application/vnd.jupyter.widget-view+json")
            box = models.get((view or {}).get("model_id", ""), {})
            children = box.get("state", {}).get("children", [])
            if box.get("model_name") != "HBoxModel" or len(children) != 3:
                continue
            ids = [c.removeprefix("IPY_MODEL_") for c in children]
            if models.get(ids[1], {}).get("model_name") not in (
                "FloatProgressModel",
                "IntProgressModel",
            ):
                continue
            out["data"]["text/plain"] = f"{value(ids[0])} {value(ids[2])}".strip()


#: the text a page shows for a stored widget it cannot draw (untrusted notebook, GitHub, nbviewer)
WIDGET_TEXT = (
    "[an interactive widget: it draws here in JupyterLab once the notebook is trusted "
    "(make lab does it) or run; run the cells above to use it]"
)


def _explain_stored_widgets(nb: Any) -> None:
    """Replace each stored widget's text fallback (its repr, ``VBox(children=(HBox(...``) by a line
    saying what it is and how to use it. tqdm bars keep the text of their final state."""
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data and _WIDGET_REPR.match(
                str(data.get("text/plain", ""))
            ):
                data["text/plain"] = WIDGET_TEXT


_WIDGET_REPR = re.compile(r"^[A-Z][A-Za-z]*\(")


def _run_cell(client: Any, cell: Any, index: int, path: Path, timeout: float) -> None:
    """Execute one cell; a timeout, a dead kernel or a cell error raise :class:`ExecuteError`."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    try:
        client.execute_cell(cell, index)
    except CellTimeoutError:
        raise ExecuteError(f"{path}: cell index {index} timed out after {timeout:g} s") from None
    except DeadKernelError:
        raise ExecuteError(f"{path}: the kernel died while running cell index {index}") from None
    except CellExecutionError as exc:
        error: dict[str, Any] = next(
            (o for o in cell.outputs if o.get("output_type") == "error"), {}
        )
        detail = f"{error.get('ename', 'error')}: {error.get('evalue', '')}".strip()
        raise ExecuteError(f"{path}: cell index {index} raised {detail}") from exc


def execute_notebook(
    path: Path | str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    kernel_name: str = "python3",
    allow_errors: bool = False,
    save: bool = True,
) -> Any:
    """Execute the notebook at ``path`` in a fresh kernel (cwd = its directory) and save it in place.

    Returns the executed notebook. Raises :class:`ExecuteError` naming the notebook and the failing
    cell (a cell error unless ``allow_errors``, a cell running over ``timeout`` seconds, or a dead
    kernel); the file is then left untouched.
    """
    from course_lib.grading.notebooks import ExerciseError, read_notebook, render_notebook

    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    path = Path(path)
    try:
        nb = read_notebook(path)
    except ExerciseError as exc:
        raise ExecuteError(str(exc)) from None
    _strip_timing(nb)
    client = make_client(
        nb, path, timeout=timeout, kernel_name=kernel_name, allow_errors=allow_errors
    )
    with client.setup_kernel(env=kernel_env()):
        _kernel_metadata(nb, client, kernel_name)
        for index, cell in enumerate(nb.cells):
            _run_cell(client, cell, index, path, timeout)
        client.set_widgets_metadata()  # stored widgets render with their last values
    _strip_timing(nb)
    _finish_progress_bars(nb)
    _explain_stored_widgets(nb)
    if save:
        try:
            text = render_notebook(nb)
        except Exception as exc:  # noqa: BLE001 - nbformat.ValidationError and friends
            raise ExecuteError(
                f"{path}: the executed notebook is not valid nbformat ({_one_line(exc)}); not saved"
            ) from exc
        path.write_bytes(text.encode("utf-8"))
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_tools.execute",
        description="Execute notebooks in place (fresh kernel, cwd = the notebook's directory) and save their outputs.",
    )
    parser.add_argument("notebooks", nargs="+", metavar="NB", help="notebook files (.ipynb)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds per cell (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    parser.add_argument(
        "--allow-errors", action="store_true", help="save the notebook even if cells raise"
    )
    args = parser.parse_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    missing = [nb for nb in args.notebooks if not Path(nb).is_file()]
    if missing:
        print(f"error: no such notebook file: {', '.join(missing)}", file=sys.stderr)
        return 2
    status = 0
    for name in args.notebooks:
        try:
            execute_notebook(
                name, timeout=args.timeout, kernel_name=args.kernel, allow_errors=args.allow_errors
            )
        except ExecuteError as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"executed {name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
