"""The typing debt, counted so that it can only shrink (CONTRIBUTING, "Checks").

mypy runs in strict mode over all of course_lib and course_tools (``strict = true`` in
pyproject.toml's ``[tool.mypy]``), except the modules named in one override that relaxes it: the
exclusion list.
Two numbers measure what is left, and neither may grow past what is recorded here:

- ``EXCLUDED``: how many modules the exclusion list names;
- ``DICT_ANY``: how many functions of both packages are annotated to return ``dict[str, Any]`` (a
  result whose keys and values no checker can follow; a dataclass or TypedDict says what it holds).

Read from the source text and the configuration, without running mypy (``make check`` runs it).
``python tests/test_typing_debt.py`` prints both numbers, one line each, and exits non-zero when
either is over its record; ``make check`` runs it. When a number goes down, lower its record.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "course_lib", ROOT / "course_tools")

# The records: today's numbers. Lower them when the debt shrinks; never raise them.
EXCLUDED = 110
DICT_ANY = 80

# What strict mode turns on per module; the exclusion list turns these off, nothing else may.
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "extra_checks",
}


def _mypy_config() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return config


def _own(patterns: list[str]) -> list[str]:
    names = [package.name for package in PACKAGES]
    return [m for m in patterns if m in names or m.split(".")[0] in names]


def _patterns(override: dict[str, Any]) -> list[str]:
    module = override["module"]
    return [module] if isinstance(module, str) else list(module)


def _relaxing(override: dict[str, Any]) -> bool:
    """Whether an override turns part of strict mode off for a module of either package."""
    return bool(_own(_patterns(override))) and (
        any(override.get(flag) is False for flag in STRICT_FLAGS)
        or override.get("implicit_reexport") is True
        or override.get("ignore_errors") is True
    )


def exclusion_list() -> list[str]:
    """The modules of course_lib and course_tools that mypy checks without strict mode."""
    modules: list[str] = []
    for override in _mypy_config().get("overrides", []):
        if _relaxing(override):
            modules += _own(_patterns(override))
    return modules


def _module_names() -> set[str]:
    names = set()
    for path in (p for package in PACKAGES for p in package.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.add(".".join(parts))
    return names


def dict_any_returns() -> list[str]:
    """``path:function`` for every function of both packages annotated ``-> dict[str, Any]``."""
    found = []
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
                text = ast.unparse(node.returns).replace(" ", "").replace("typing.", "")
                if text in {"dict[str,Any]", "Dict[str,Any]"}:
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{node.name}")
    return found


def test_strict_is_the_default():
    config = _mypy_config()
    assert config.get("strict") is True, "pyproject.toml [tool.mypy] must keep strict = true"
    assert config.get("files") == [package.name for package in PACKAGES], config.get("files")


def test_one_named_exclusion_list():
    relaxing = [o for o in _mypy_config().get("overrides", []) if _relaxing(o)]
    assert len(relaxing) == 1, f"one override may relax strict mode, found {len(relaxing)}"
    modules = exclusion_list()
    assert modules == _patterns(relaxing[0]), "the exclusion list names the packages' modules only"
    assert modules == sorted(set(modules)), "keep the exclusion list sorted, each module once"
    unknown = sorted(set(modules) - _module_names())
    assert not unknown, f"not modules of the packages (name each module, no wildcards): {unknown}"


def test_the_exclusion_list_only_shrinks():
    n = len(exclusion_list())
    assert n <= EXCLUDED, (
        f"{n} modules excluded from strict mypy, recorded {EXCLUDED}: fix, not add"
    )


def test_dict_any_returns_only_shrink():
    found = dict_any_returns()
    assert len(found) <= DICT_ANY, (
        f"{len(found)} functions return dict[str, Any], recorded {DICT_ANY}: "
        "return a dataclass or a TypedDict instead"
    )


def main() -> int:
    excluded, dict_any = len(exclusion_list()), len(dict_any_returns())
    print(f"mypy strict: {excluded} modules excluded (record {EXCLUDED}; may only shrink)")
    print(f"functions returning dict[str, Any]: {dict_any} (record {DICT_ANY}; may only shrink)")
    return 0 if excluded <= EXCLUDED and dict_any <= DICT_ANY else 1


if __name__ == "__main__":
    sys.exit(main())
