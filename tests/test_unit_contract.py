"""Every unit package follows the contract written in ``course_lib/units/__init__.py``.

Required modules present, optional ones known, nothing unknown; the template holds one of each
module a unit may have; ``unit.<module>`` loads every module a unit has (``unit.cluster``
included); a unit that leaves the contract is listed, with its reason, in ``CONTRACT_EXCEPTIONS``.
"""

from __future__ import annotations

import importlib
import pathlib
import shutil

import pytest

import course_lib.units as units

UNITS_DIR = pathlib.Path(units.__file__).parent
UNIT_DIRS = sorted(p for p in UNITS_DIR.glob("u[0-9][0-9]_*") if p.is_dir())


def test_the_units_are_found():
    assert len(UNIT_DIRS) >= 15


@pytest.mark.parametrize("unit_dir", UNIT_DIRS, ids=lambda p: p.name)
def test_unit_follows_the_contract(unit_dir):
    assert units.contract_violations(unit_dir) == []


@pytest.mark.parametrize("unit_dir", UNIT_DIRS, ids=lambda p: p.name)
def test_every_module_a_unit_has_loads_by_attribute(unit_dir):
    package = importlib.import_module(f"course_lib.units.{unit_dir.name}")
    for name in units.UNIT_MODULES:
        if (unit_dir / f"{name}.py").exists():
            assert getattr(package, name).__name__ == f"{package.__name__}.{name}"
    with pytest.raises(AttributeError, match="may have cluster"):
        package.not_a_unit_module  # noqa: B018


def test_the_template_holds_every_module_a_unit_may_have():
    template = UNITS_DIR / "_template"
    assert {p.stem for p in template.glob("*.py")} == {"__init__", *units.UNIT_MODULES}
    assert units.contract_violations(template) == []


def test_the_contract_names_a_unit_missing_a_required_module(tmp_path):
    unit = shutil.copytree(UNITS_DIR / "u09_data_parallelism", tmp_path / "u09_data_parallelism")
    (unit / "plots.py").unlink()
    (unit / "notes.py").write_text("")
    (unit / "scratch").mkdir()
    assert units.contract_violations(unit) == [
        "u09_data_parallelism: missing plots.py",
        "u09_data_parallelism: unknown module notes.py",
        "u09_data_parallelism: unknown folder scratch/",
    ]


@pytest.mark.parametrize("name", sorted(units.CONTRACT_EXCEPTIONS))
def test_an_exception_says_why_and_lists_exactly_what_the_unit_has(name):
    modules, why = units.CONTRACT_EXCEPTIONS[name]
    assert len(why) > 40
    present = {p.stem for p in (UNITS_DIR / name).glob("*.py")} & set(units.UNIT_MODULES)
    assert present == set(modules), f"{name} now has {sorted(present)}: update the exception"


# ---- typed rows (course_lib.kit): what plots and checks read is a field of a row ----------


def _reading_modules(unit_dir: pathlib.Path):
    for path in sorted(unit_dir.glob("*.py")):
        if path.stem.startswith(("plots", "checks")):
            yield importlib.import_module(f"course_lib.units.{unit_dir.name}.{path.stem}")


@pytest.mark.parametrize("unit_dir", UNIT_DIRS, ids=lambda p: p.name)
def test_the_columns_plots_and_checks_read_are_fields_of_their_rows(unit_dir):
    from course_lib import kit

    found = []
    for module in _reading_modules(unit_dir):
        found += kit.reads_violations(module.__name__, getattr(module, "READS", {}))
    assert found == []
