"""The course's JupyterLab settings (jupyter/, as `make lab` and `make lab-instructor` load them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _settings(monkeypatch, solutions: str | None):
    from traitlets.config.loader import PyFileConfigLoader

    if solutions is None:
        monkeypatch.delenv("COURSE_SOLUTIONS", raising=False)
    else:
        monkeypatch.setenv("COURSE_SOLUTIONS", solutions)
    return PyFileConfigLoader("jupyter_server_config.py", path=str(ROOT / "jupyter")).load_config()


@pytest.mark.parametrize(("solutions", "listed"), [(None, False), ("show", True)])
def test_a_learners_lab_does_not_list_solutions_and_an_instructors_does(
    monkeypatch, solutions, listed
):
    """Issue 52 item 6: solutions/ was one click away in the learner's file browser."""
    from jupyter_server.services.contents.manager import ContentsManager

    config = _settings(monkeypatch, solutions)
    manager = ContentsManager(config=config)
    assert manager.should_list("solutions") is listed
    assert manager.should_list("notebooks") and manager.should_list("exercises")
    assert not manager.should_list("__pycache__")  # jupyter_server's own still hidden


def test_make_lab_instructor_is_make_lab_with_solutions_listed():
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^lab-instructor: export COURSE_SOLUTIONS := show$", makefile, re.M)
    assert re.search(r"^lab lab-instructor: \$\(LAB_STAMP\)$", makefile, re.M)
    assert "make lab-instructor" in (ROOT / "README.md").read_text()


def test_the_lab_loads_the_course_style(monkeypatch):
    """custom.css (printed text that scrolls, no red marks on saved widgets, snapshots hidden
    under live widgets) is served: JupyterLab loads it only with custom_css on."""
    config = _settings(monkeypatch, None)
    assert config.LabApp.custom_css is True
    css_dirs = config.ServerApp.tornado_settings.get_value({})["static_custom_path"]
    assert Path(css_dirs[0], "custom.css") == ROOT / "jupyter" / "custom" / "custom.css"
