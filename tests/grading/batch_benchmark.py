"""What the sandbox costs: a class graded one notebook at a time and as one batch, side by side.

    python tests/grading/batch_benchmark.py [N_NOTEBOOKS] [--units 00,02,12] [--baseline DIR]

Copies solutions and untouched exercises of the given units under other names into a
submissions folder (one learner folder each), then, in one run:

1. grades every notebook alone with the grade command in its sandbox (``--isolation required``),
   the sum of those single runs;
2. with ``--baseline DIR`` (another checkout of the course, e.g. ``git worktree add ../base
   06d6689``), grades every notebook alone with that checkout's grade command, interleaved with
   (1) so both see the same machine;
3. grades the folder as one batch, ``--jobs 2``, in the sandbox;

checks that the batch's CSV says what the single runs said, and prints the times and ratios.
Not a test: it takes minutes; the README's grading section quotes its numbers.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _grade(repo: Path, target: Path, *extra: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "course_lib.grade", str(target), *extra],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return time.perf_counter() - start, proc


def _class(units: list[str], n: int) -> Path:
    subs = Path(tempfile.mkdtemp(prefix="class-")) / "submissions"
    for i in range(n):
        unit = units[i % len(units)]
        kind = "solutions" if i % 2 == 0 else "exercises"
        target = subs / f"learner{i:02d}" / f"homework_{i}.ipynb"
        target.parent.mkdir(parents=True)
        nb = json.loads((REPO / kind / f"{unit}.ipynb").read_text())
        nb["metadata"].setdefault("course", {})["unit"] = unit  # renamed: the grader needs the unit
        target.write_text(json.dumps(nb))
    return subs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=20)
    parser.add_argument(
        "--units", default="00_start_here,02_batch_size_and_accumulation,12_pipeline_parallelism"
    )
    parser.add_argument("--baseline", default=None, help="another checkout to time beside this one")
    args = parser.parse_args()
    subs = _class(args.units.split(","), args.n)
    # like with like: both courses with their bytecode written, as after any first run
    for repo in [REPO] + ([Path(args.baseline)] if args.baseline else []):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "course_lib")])
    single: dict[str, list] = {}
    sandbox_s = baseline_s = 0.0
    for path in sorted(subs.rglob("*.ipynb")):
        who = path.parent.name
        took, proc = _grade(REPO, path, "--learner", who, "--json", "--isolation", "required")
        sandbox_s += took
        report = json.loads(proc.stdout)
        single[who] = [(t["task"], t["passed"]) for t in report["tasks"]]
        if args.baseline:
            took, _ = _grade(Path(args.baseline), path, "--learner", who, "--json")
            baseline_s += took
    n = len(single)
    print(f"{n} notebooks ({args.units}), {os.cpu_count()} CPU cores", flush=True)
    print(f"single runs in the sandbox: {sandbox_s:.1f} s in total ({sandbox_s / n:.1f} s each)")
    if args.baseline:
        print(
            f"single runs, baseline {args.baseline}: {baseline_s:.1f} s in total; sandbox / "
            f"baseline = {sandbox_s / baseline_s:.2f}",
            flush=True,
        )
    out = subs.parent / "grades.csv"
    batch_s, proc = _grade(REPO, subs, "--csv", str(out), "--jobs", "2", "--isolation", "required")
    assert proc.returncode == 0, proc.stderr[-2000:]
    from_csv: dict[str, list] = {}
    for row in csv.DictReader(open(out, encoding="utf-8")):
        from_csv.setdefault(row["learner"], []).append((int(row["task"]), row["passed"] == "True"))
    differ = {
        who: (single.get(who), from_csv.get(who))
        for who in sorted(set(single) | set(from_csv))
        if single.get(who) != from_csv.get(who)
    }
    assert not differ, f"the batch's CSV differs from the single runs (single, batch): {differ}"
    print(
        f"one batch, --jobs 2, in the sandbox: {batch_s:.1f} s; single runs / batch = "
        f"{sandbox_s / batch_s:.2f} (the CSV matches the single runs)"
    )
    shutil.rmtree(subs.parent)


if __name__ == "__main__":
    main()
