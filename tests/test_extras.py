"""What `make lab` installs: the core and the lab, never the packages only units 04 and 07 use
(bitsandbytes, peft and the transformers peft brings) unless a learner asks for them by name
(`make lab EXTRAS=units`); the maintainer's install (`make test`) keeps them; units 04 and 07
say in one line how to add them, naming an extra that exists.
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import re
import shutil
import subprocess
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = {"bitsandbytes", "peft", "transformers"}
NEEDS = {  # the lectures and exercises that need an optional extra
    "notebooks/04_optimizer_memory.ipynb": "adam8bit",
    "solutions/04_optimizer_memory.ipynb": "adam8bit",
    "exercises/04_optimizer_memory.ipynb": "adam8bit",
    "notebooks/07_lora_qlora.ipynb": "lora",
}


def _installed_extras(target: str, extras: str = "") -> list[str]:
    """The extras the Makefile's ``target`` installs the course with (its dry run, in a virtual
    environment that does not exist, so every step is printed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    args = ["make", "-n", target, "VENV=/nonexistent/venv"] + (
        [f"EXTRAS={extras}"] if extras else []
    )
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    (found,) = re.findall(r'-e "\.\[([^\]]*)\]"', out.stdout)
    return found.split(",")


def _own_requirements(extras: list[str]) -> set[Requirement]:
    """The course's requirements with these extras (an extra naming the course itself,
    ``course_lib[x]``, is followed)."""
    out: set[Requirement] = set()
    todo, seen = list(extras), set()
    for text in PROJECT["dependencies"]:
        out.add(Requirement(text))
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                todo += sorted(req.extras)
            else:
                out.add(req)
    return out


def _closure(requirements: set[Requirement]) -> set[str]:
    """Every distribution these requirements bring, read from the installed distributions'
    metadata (their own extras left out, as pip leaves them out)."""
    found: set[str] = set()
    todo = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in found:
            continue
        found.add(name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here (a platform-only wheel): its name is still counted
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return found


def test_make_lab_installs_the_core_and_the_lab_only():
    assert _installed_extras("install-lab") == ["lab"]


def test_the_default_lab_install_brings_none_of_the_optional_packages():
    requirements = _own_requirements(_installed_extras("install-lab"))
    assert not {canonicalize_name(r.name) for r in requirements} & OPTIONAL
    brought = _closure(requirements)
    assert "jupyterlab" in brought and "torch" in brought  # the closure is really followed
    assert not brought & OPTIONAL, sorted(brought & OPTIONAL)


def test_asking_for_an_extra_adds_it_and_the_maintainers_install_keeps_them():
    assert _installed_extras("install-lab", "units") == ["lab", "units"]
    assert _installed_extras("install-lab", "adam8bit,lora") == ["lab", "adam8bit", "lora"]
    maintainer = _installed_extras("install")
    assert "dev" in maintainer and "tools" in maintainer  # course_tools' extra: site, benchmarks
    names = {canonicalize_name(r.name) for r in _own_requirements(maintainer)}
    assert {"bitsandbytes", "peft", "nbconvert", "accelerate"} <= names
    if all(_has(n) for n in ("peft", "transformers")):  # peft brings transformers
        assert "transformers" in _closure(_own_requirements(maintainer))


def _has(name: str) -> bool:
    try:
        importlib.metadata.version(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.parametrize("path, extra", sorted(NEEDS.items()))
def test_a_unit_that_needs_an_extra_says_how_to_get_it_in_one_line(path, extra):
    assert extra in PROJECT["optional-dependencies"]
    cells = json.loads((ROOT / path).read_text(encoding="utf-8"))["cells"]
    lines = [
        line
        for cell in cells
        if cell["cell_type"] == "markdown"
        for line in "".join(cell["source"]).splitlines()
        if "make lab EXTRAS=" in line
    ]
    assert len(lines) == 1, lines
    assert f"make lab EXTRAS={extra}`" in lines[0]
    assert f'pip install -c constraints.txt -e ".[{extra}]"' in lines[0]


def test_a_missing_optional_package_is_one_line_naming_the_command():
    from course_lib.runtime.compat import import_optional

    with pytest.raises(ImportError) as info:
        import_optional("no_such_package_here.sub", extra="lora", needed_for="the NF4 table")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the NF4 table needs no_such_package_here, which `make lab`")
    assert 'pip install -c constraints.txt -e ".[lora]"' in message
    assert "make lab EXTRAS=lora" in message
