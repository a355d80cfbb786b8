"""The machine the check ran on, and the Markdown report: ``docs/gpu-check-YYYY-MM-DD.md``."""

from __future__ import annotations

import datetime as dt
import pathlib
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass

import torch

import course_lib
from course_tools.gpu_check.core import GROUP_TITLES, CheckResult, Device, Figure

_COMMAND_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Environment:
    """What the report says about the machine and the software."""

    device: Device
    gpus: tuple[str, ...]
    """one line per GPU: index, name, memory, compute capability"""
    driver: str
    cuda: str
    """the CUDA version torch was built with"""
    torch: str
    cudnn: str
    nccl: str
    cpu: str
    platform: str
    commit: str
    """the course's git commit, when the check runs from a clone"""


def _command(*args: str) -> str:
    """First line a command prints, or "" when it is missing, fails or takes too long."""
    if shutil.which(args[0]) is None:
        return ""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else ""


def _nccl_version() -> str:
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        return "none"
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def environment(device: Device) -> Environment:
    """Read the environment (``course_lib.hardware_report`` plus the driver, cuDNN, NCCL)."""
    hw = course_lib.hardware_report()
    gpus = tuple(
        f"{g['index']}: {g['name']}, {g['memory_gib']} GiB, sm {g['compute_capability']}"
        for g in hw["gpus"]
    )
    driver = _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    here = pathlib.Path(__file__).resolve().parent
    commit = _command("git", "-C", str(here), "rev-parse", "--short=12", "HEAD")
    return Environment(
        device=device,
        gpus=gpus,
        driver=driver or "unknown (no nvidia-smi)",
        cuda=hw["cuda_version"] or "none (CPU build of torch)",
        torch=hw["torch_version"],
        cudnn=str(torch.backends.cudnn.version()) if torch.cuda.is_available() else "none",
        nccl=_nccl_version(),
        cpu=f"{hw['cpu_model']}, {hw['cpu_logical_cores']} logical cores, {hw['ram_gib']} GiB",
        platform=hw["platform"],
        commit=commit or "unknown (not a git clone)",
    )


def report_path(out: pathlib.Path, device: Device, day: dt.date) -> pathlib.Path:
    """``gpu-check-YYYY-MM-DD.md``; a ``--device cpu`` run adds ``-cpu`` (it is no GPU report)."""
    suffix = "" if device == "cuda" else f"-{device}"
    return out / f"gpu-check-{day.isoformat()}{suffix}.md"


def _cell(value: Figure) -> str:
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e3 else f"{value:,.0f}"
    else:
        text = value
    return text.replace("|", "\\|").replace("\n", " ")


def _header(env: Environment, results: list[CheckResult], when: dt.datetime) -> list[str]:
    counts = Counter(r.status for r in results)
    total = sum(r.seconds for r in results)
    lines = [f"# GPU check, {when.date().isoformat()}", ""]
    if env.device != "cuda":
        lines += [
            f"> Run with `--device {env.device}`: the CUDA-only parts are skipped. This report",
            "> tests the check itself; it is not a GPU report.",
            "",
        ]
    lines += [
        f"`python -m course_tools.gpu_check --device {env.device}`, {when:%Y-%m-%d %H:%M} UTC, "
        f"commit {env.commit}: {len(results)} checks, {counts['passed']} passed, "
        f"{counts['failed']} failed, {counts['skipped']} skipped ({total:.0f} s in the checks).",
        "",
        "| | |",
        "|---|---|",
    ]
    rows = [
        ("GPUs", f"{len(env.gpus)}: " + "; ".join(env.gpus) if env.gpus else "0"),
        ("driver", env.driver),
        ("CUDA (torch build)", env.cuda),
        ("torch", env.torch),
        ("cuDNN", env.cudnn),
        ("NCCL", env.nccl),
        ("CPU", env.cpu),
        ("platform", env.platform),
    ]
    return lines + [f"| {k} | {_cell(v)} |" for k, v in rows] + [""]


def _summary(results: list[CheckResult]) -> list[str]:
    lines = ["## Summary", "", "| part | check | result | s | note |", "|---|---|---|---:|---|"]
    for r in results:
        lines.append(
            f"| {r.group} | {_cell(r.name)} | {r.status} | {r.seconds:.1f} "
            f"| {_cell(r.outcome.note)} |"
        )
    return lines + [""]


def _details(results: list[CheckResult]) -> list[str]:
    lines: list[str] = []
    for group, title in GROUP_TITLES.items():
        lines += [f"## {group}. {title}", ""]
        for r in (r for r in results if r.group == group):
            lines += [f"### {r.name}: {r.status}", ""]
            if r.about:
                lines += [f"*{r.about}*", ""]
            if r.outcome.note:
                lines += [r.outcome.note, ""]
            if r.outcome.figures:
                lines += ["| figure | value |", "|---|---:|"]
                lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in r.outcome.figures.items()]
                lines.append("")
            if r.outcome.warnings:
                lines += ["Warnings:", "", *(f"- {_cell(w)}" for w in r.outcome.warnings), ""]
            if r.outcome.error:
                lines += ["```text", r.outcome.error, "```", ""]
    return lines


def render(env: Environment, results: list[CheckResult], when: dt.datetime) -> str:
    """The whole report, as Markdown."""
    lines = _header(env, results, when) + _summary(results) + _details(results)
    note = (
        "Units 04, 06 and 07 have no run function with a `device` argument "
        "(their runs are CPU, meta-device or virtual-cluster only), so part a skips them."
    )
    return "\n".join([*lines, note, ""])


def write_report(
    out: pathlib.Path, env: Environment, results: list[CheckResult], when: dt.datetime
) -> pathlib.Path:
    """Write the report into ``out`` (created if missing); return its path."""
    out.mkdir(parents=True, exist_ok=True)
    path = report_path(out, env.device, when.date())
    path.write_text(render(env, results, when), encoding="utf-8")
    return path
