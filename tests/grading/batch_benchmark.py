"""How long a class takes: 30 notebooks graded one by one, then as one batch (``--jobs 2``).

    python tests/grading/batch_benchmark.py [N_NOTEBOOKS] [--units 00,02,12]

Copies solutions and untouched exercises of the given units under other names into a
submissions folder (one learner folder each), grades every notebook alone with ``grade_notebook``
(the sum of single runs), then the folder with ``grade_folder(jobs=2)``, checks that the CSV says
what the single runs said, and prints both wall times and their ratio. Not a test: it takes
minutes; the README's grading section quotes its numbers.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
import time
from pathlib import Path

from course_lib.grading.batch import grade_folder
from course_lib.grading.grader import grade_notebook

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=30)
    parser.add_argument(
        "--units", default="00_start_here,02_batch_size_and_accumulation,12_pipeline_parallelism"
    )
    args = parser.parse_args()
    units = args.units.split(",")
    root = Path(tempfile.mkdtemp(prefix="class-"))
    subs = root / "submissions"
    for i in range(args.n):
        unit = units[i % len(units)]
        kind = "solutions" if i % 2 == 0 else "exercises"
        target = subs / f"learner{i:02d}" / f"homework_{i}.ipynb"
        target.parent.mkdir(parents=True)
        nb = json.loads((REPO / kind / f"{unit}.ipynb").read_text())
        nb["metadata"].setdefault("course", {})["unit"] = unit  # renamed: the grader needs the unit
        target.write_text(json.dumps(nb))
    notebooks = sorted(subs.rglob("*.ipynb"))
    start = time.perf_counter()
    single = {}
    for path in notebooks:
        report = grade_notebook(path, learner=path.parent.name)
        single[path.parent.name] = [(t.task, t.passed) for t in report.tasks]
    singles = time.perf_counter() - start
    start = time.perf_counter()
    grade_folder(subs, root / "grades.csv", jobs=2, timeout=300)
    batch = time.perf_counter() - start
    rows = list(csv.DictReader(open(root / "grades.csv", encoding="utf-8")))
    from_csv: dict[str, list] = {}
    for row in rows:
        from_csv.setdefault(row["learner"], []).append((int(row["task"]), row["passed"] == "True"))
    assert from_csv == single, "the batch's CSV differs from the single runs"
    print(
        f"{len(notebooks)} notebooks: single runs {singles:.1f} s in total, batch {batch:.1f} s, "
        f"ratio {singles / batch:.2f} (the CSV matches the single runs)"
    )
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
