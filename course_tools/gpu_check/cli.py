"""``python -m course_tools.gpu_check [--out DIR] [--device cuda|cpu] [--timeout S]``.

Exit status: 0 when every check passed or was skipped (and when there is no GPU: nothing runs,
no report is written); 1 when a check failed (the report is written all the same); 2 for a
bad option.
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import sys
from typing import cast

import torch

from course_lib import validate
from course_tools.gpu_check.catalog import CHECKS
from course_tools.gpu_check.core import DEVICES, CheckResult, Device, Settings, run_checks
from course_tools.gpu_check.report import environment, write_report

PROG = "python -m course_tools.gpu_check"
#: seconds one check may take unless --timeout says otherwise
DEFAULT_TIMEOUT_S = 300.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the course's CUDA paths and write docs/gpu-check-YYYY-MM-DD.md.",
    )
    parser.add_argument(
        "--out", default="docs", metavar="DIR", help="folder of the report (default: docs)"
    )
    parser.add_argument(
        "--device",
        default=None,
        metavar="{cuda,cpu}",
        help="cuda (default when a GPU is present) or cpu: every path that can run without "
        "CUDA, the CUDA-only parts reported as skipped (writes gpu-check-DATE-cpu.md)",
    )
    parser.add_argument(
        "--timeout",
        default=str(DEFAULT_TIMEOUT_S),
        metavar="SECONDS",
        help=f"seconds each check may take (default: {DEFAULT_TIMEOUT_S:g})",
    )
    return parser


def _options(args: argparse.Namespace) -> tuple[Device | None, float]:
    """The device asked for (None: the default) and the timeout; ValueError names a bad one."""
    device = None
    if args.device is not None:
        device = cast(Device, validate.choice("--device", args.device, DEVICES))
    try:
        timeout = float(args.timeout)
    except ValueError:
        raise ValueError(
            f"--timeout = {validate.describe(args.timeout)}: expected a number > 0"
        ) from None
    return device, validate.number("--timeout", timeout, positive=True)


def _progress(result: CheckResult) -> None:
    note = f": {result.outcome.note}" if result.outcome.note else ""
    print(f"{result.status:>7}  {result.group}. {result.name} ({result.seconds:.1f} s){note}")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        device, timeout = _options(args)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if device != "cpu" and not torch.cuda.is_available():
        print("No GPU here (torch.cuda.is_available() is False): nothing to check, no report.")
        print(f"To exercise the check itself on the CPU: {PROG} --device cpu")
        return 0
    settings = Settings(device=device or "cuda", timeout_s=timeout)
    env = environment(settings.device)
    print(f"GPU check on {settings.device}: {len(CHECKS)} checks, each within {timeout:g} s")
    results = run_checks(CHECKS, settings, progress=_progress)
    path = write_report(pathlib.Path(args.out), env, results, dt.datetime.now(dt.timezone.utc))
    print(f"report: {path}")
    return 1 if any(r.status == "failed" for r in results) else 0
