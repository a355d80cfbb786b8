"""The package's import rules (CONTRIBUTING.md, "Layout"), checked on the source text.

1. No unit imports another unit (what two units share lives in a mechanism layer).
2. Only plots and widgets draw: nothing outside ``units/*/plots.py``, ``units/*/widgets.py`` and
   ``viz/`` imports matplotlib or ipywidgets (so ranks and check cells never pay for them).
3. A unit's ``checks.py`` and its ``checks_<section>.py`` files import only the standard library,
   ``course_lib.grading`` and those section files at module level (heavier imports go inside the
   check functions), so a check cell imports fast.
4. Mechanism layers never import ``course_lib.units``.

Every violation is reported with its file, line and import, all at once.
"""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
DRAWING = ("matplotlib", "ipywidgets")
CHECKS_MAY_IMPORT = ("course_lib.grading",)


def _imports(path: pathlib.Path, base: pathlib.Path):
    """(line, module, at_module_level) for every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(base).with_suffix("").parts[:-1])
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import: resolve against this file's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            yield node.lineno, name, id(node) in top_level


def _unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["course_lib", "units"] and len(parts) > 2 and re.match(r"u\d\d_", parts[2]):
        return parts[2]
    return None


def violations(root: pathlib.Path = PACKAGE) -> list[str]:
    found: dict[tuple, str] = {}  # one message per import statement and rule
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        parts = rel.parts  # ("course_lib", "units", "u08_collectives", "run.py")
        in_units = len(parts) > 3 and parts[1] == "units" and not parts[2].startswith("_")
        own_unit = parts[2] if in_units else None
        may_draw = parts[1] == "viz" or (in_units and path.name in ("plots.py", "widgets.py"))
        for line, module, top in _imports(path, root.parent):
            where = f"{rel}:{line} imports {module}"
            other = _unit_of(module)
            if in_units and other and other != own_unit:
                found.setdefault(
                    (rel, line, 1),
                    f"{where}: a unit must not import another unit ({other}); move "
                    "what both need into a mechanism layer",
                )
            if not may_draw and module.split(".")[0] in DRAWING:
                found.setdefault(
                    (rel, line, 2),
                    f"{where}: only units/*/plots.py, units/*/widgets.py and viz/ may "
                    "import matplotlib or ipywidgets",
                )
            is_checks = path.name == "checks.py" or path.name.startswith("checks_")
            if in_units and is_checks and top:
                root_name = module.split(".")[0]
                stdlib = root_name in sys.stdlib_module_names or root_name == "__future__"
                own_section = module.startswith(f"course_lib.units.{own_unit}.checks_")
                if not stdlib and not own_section and not module.startswith(CHECKS_MAY_IMPORT):
                    found.setdefault(
                        (rel, line, 3),
                        f"{where}: checks.py imports only the standard library and "
                        "course_lib.grading at module level; import it inside the check",
                    )
            if not in_units and parts[1] != "units" and module.startswith("course_lib.units"):
                found.setdefault(
                    (rel, line, 4), f"{where}: mechanism layers never import course_lib.units"
                )
    return list(found.values())


def test_the_package_follows_the_import_rules():
    found = violations()
    assert not found, "import rules broken:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "relpath, source, message",
    [
        (
            "units/u01_a/run.py",
            "from course_lib.units.u02_b import run\n",
            "must not import another unit",
        ),
        ("units/u01_a/run.py", "import matplotlib.pyplot as plt\n", "may import matplotlib"),
        (
            "measure/thing.py",
            "def f():\n    import ipywidgets\n",
            "may import matplotlib or ipywidgets",
        ),
        ("units/u01_a/checks.py", "import torch\n", "import it inside the check"),
        (
            "parallel/x.py",
            "from course_lib.units.u01_a import run\n",
            "never import course_lib.units",
        ),
    ],
)
def test_a_planted_bad_import_is_named(tmp_path, relpath, source, message):
    pkg = tmp_path / "course_lib"
    target = pkg / relpath
    target.parent.mkdir(parents=True)
    target.write_text(source)
    found = violations(pkg)
    assert len(found) == 1 and message in found[0] and relpath in found[0], found


def test_allowed_imports_are_not_flagged(tmp_path):
    pkg = tmp_path / "course_lib"
    for relpath, source in {
        "units/u01_a/plots.py": "import matplotlib.pyplot as plt\n",
        "units/u01_a/checks.py": "import json\nfrom course_lib.grading import passed\n"
        "def check():\n    import torch\n",
        "units/u01_a/run.py": "from course_lib.units.u01_a import plots\nfrom . import checks\n",
        "viz/widgets.py": "import ipywidgets\n",
    }.items():
        (pkg / relpath).parent.mkdir(parents=True, exist_ok=True)
        (pkg / relpath).write_text(source)
    assert violations(pkg) == []


def test_a_check_cell_imports_no_heavy_module():
    """What rule 3 is for: importing every unit's checks loads neither torch nor matplotlib."""
    code = textwrap.dedent("""
        import importlib, pathlib, sys
        for p in sorted(pathlib.Path("course_lib/units").glob("u*/checks.py")):
            importlib.import_module(f"course_lib.units.{p.parent.name}.checks")
        print(sorted(m for m in ("torch", "matplotlib", "pandas", "ipywidgets") if m in sys.modules))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
