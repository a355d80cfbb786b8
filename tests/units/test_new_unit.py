"""``make new-unit`` gives a unit its four files, filled in, and refuses bad names."""

from __future__ import annotations

import shutil

import pytest

from course_tools import new_unit as N


def test_new_unit_copies_the_template(tmp_path):
    shutil.copytree(
        N.ROOT / "course_lib" / "units" / "_template",
        tmp_path / "course_lib" / "units" / "_template",
    )
    path = N.new_unit("05", "cpu_offload", "CPU offload", root=tmp_path)
    assert sorted(p.name for p in path.glob("*.py")) == [
        "__init__.py",
        "checks.py",
        "plots.py",
        "run.py",
        "widgets.py",
    ]
    assert (
        '"""Unit 05: CPU offload (notebooks/05_cpu_offload.ipynb)."""'
        in (path / "__init__.py").read_text()
    )
    assert "NN" not in (path / "checks.py").read_text()
    assert (tmp_path / "tests" / "units" / "u05_cpu_offload").is_dir()
    with pytest.raises(FileExistsError):
        N.new_unit("05", "cpu_offload", "again", root=tmp_path)
    with pytest.raises(ValueError, match="NN = '5': expected two digits"):
        N.new_unit("5", "x", "x", root=tmp_path)
    with pytest.raises(ValueError, match="TOPIC = 'CPU-offload'"):
        N.new_unit("06", "CPU-offload", "x", root=tmp_path)
