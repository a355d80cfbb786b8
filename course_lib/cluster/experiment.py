"""What a unit can send to a cluster: named experiments, declared by each unit in its
``units/uNN_topic/cluster.py``, found here through the units the course's catalogue finds
(:mod:`course_lib.catalogue`).

An :class:`Experiment` wraps the function the lecture runs (``unit.run.x``) so that it takes the
world size first: ``run(world_size, **settings)``. Its settings and their defaults are read from
that signature, so a setting has one default, in the unit. ``check(world_size, settings)``, when
the unit gives one, refuses a world size the experiment cannot use (e.g. tp not dividing the
heads) before any rank starts. The cluster layer never imports a unit by name (the package's
import rules: mechanism layers do not depend on units); it discovers the units' declarations.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from course_lib import catalogue, validate


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One multi-rank experiment of a unit, exportable to a torchrun script.

    name: ``uNN.short`` (e.g. ``u09.bytes``); title: one line for listings and the script's
    docstring; run: ``run(world_size, **settings)`` returning what the notebook gets (a DataFrame
    or plain data); lecture: the notebook that runs it; plot: how to draw the loaded result
    (shown in the script's docstring); varying: result columns (or keys) that differ from run to
    run: measured times, and a peak that depends on when a message completes (everything else is
    deterministic and must be equal under torchrun and under launch); world_size: the world size
    from the settings when the settings fix it (the 3-D run: dp x tp x pp), else None; check: raises ValueError for a world size it cannot
    use; minimum: the smallest world size; canonical: the deterministic part of a value, for
    results whose row order or optional rows depend on timing (a timeline's events); backend:
    what ``backend='auto'`` means while it runs, under launch and torchrun alike ("gloo": the
    course's experiments keep their tensors on the CPU, so a GPU node runs them on gloo too;
    "auto": launch's rule, NCCL when every rank on a node has a GPU).
    """

    name: str
    title: str
    run: Callable[..., Any]
    lecture: str
    plot: str = ""
    varying: tuple[str, ...] = ()
    world_size: Callable[[dict], int] | None = None
    check: Callable[[int, dict], None] | None = None
    minimum: int = 2
    canonical: Callable[[Any], Any] | None = None
    backend: str = "gloo"

    def differences(self, a: Any, b: Any) -> list[str]:
        """Where two values of this experiment differ in what must not vary (empty: the same);
        what varies from run to run (``varying``) is left out."""
        from course_lib.cluster.results import differences

        if self.canonical is not None:
            a, b = self.canonical(a), self.canonical(b)
        return differences(a, b, ignore=self.varying)

    @property
    def defaults(self) -> dict[str, Any]:
        """The settings and their defaults, from ``run``'s keyword-only parameters."""
        sig = inspect.signature(self.run)
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY
        }

    @property
    def unit(self) -> str:
        return self.name.split(".")[0]

    def settings(self, overrides: dict | None = None) -> dict[str, Any]:
        """The defaults with ``overrides`` applied; an unknown setting is refused, naming the
        valid ones; a value is checked against the default's kind (int, float, bool, str, or a
        tuple of them)."""
        defaults = self.defaults
        out = dict(defaults)
        for key, value in (overrides or {}).items():
            if key not in defaults:
                valid = ", ".join(defaults) or "none"
                raise ValueError(
                    f"setting {key} = {value!r}: {self.name} has no such setting; "
                    f"valid settings: {valid}"
                )
            out[key] = _coerce(key, value, defaults[key])
        return out

    def resolve_world_size(self, world_size: int | None, settings: dict) -> int:
        """The world size this run uses: the one the settings fix, or ``world_size``; checked."""
        fixed = self.world_size(settings) if self.world_size else None
        if fixed is not None:
            if world_size is not None and world_size != fixed:
                raise ValueError(
                    f"world_size = {world_size}: {self.name} runs on exactly {fixed} "
                    f"ranks with these settings ({_settings_text(settings)})"
                )
            world_size = fixed
        if world_size is None:
            raise ValueError(
                f"world_size = None: {self.name} needs a world size (an int >= {self.minimum})"
            )
        world_size = validate.count("world_size", world_size, minimum=self.minimum)
        if self.check is not None:
            self.check(world_size, settings)
        return world_size

    def check_run(self, world_size: int, settings: dict) -> None:
        """Refuse what the unit's own function would refuse with these settings on
        ``world_size`` ranks (``numel = -5: expected ...``), by running it up to its first
        ``course_lib.launch``, which starts nothing here (``runtime.dry_run``). The one set of
        rules ``export`` and an exported script apply, before anything is written or started."""
        from course_lib.runtime.dry_run import check_arguments

        check_arguments(self.run, world_size, **settings)


def batch_divides(rows: int) -> Callable[[int, dict], None]:
    """A ``check`` for experiments whose global batch of ``rows`` rows is split evenly over the
    ranks: refuses a world size that does not divide it, listing the ones that do."""

    def check(world_size: int, settings: dict) -> None:
        if rows % world_size:
            valid = ", ".join(str(n) for n in range(2, rows + 1) if rows % n == 0)
            raise ValueError(
                f"world_size = {world_size}: the global batch of {rows} rows must "
                f"split evenly; valid: {valid}"
            )

    return check


def _settings_text(settings: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items())


def _coerce(key: str, value: Any, default: Any) -> Any:
    """``value`` as the kind of ``default``; strings (from a command line) are parsed."""
    if isinstance(default, bool):
        if isinstance(value, str):
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ValueError(f"setting {key} = {value!r}: expected true or false")
    if isinstance(default, int):
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"setting {key} = {value!r}: expected an int") from None
        return validate.count(key, value, minimum=None)
    if isinstance(default, float):
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"setting {key} = {value!r}: expected a number") from None
        return float(validate.number(key, value, finite=True))  # inf: no run has a use for it
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ValueError(f"setting {key} = {value!r}: expected a string")
        return value
    if isinstance(default, tuple):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise ValueError(f"setting {key} = {value!r}: expected a comma-separated list")
        kinds = {type(d) for d in default}
        kind = kinds.pop() if len(kinds) == 1 else str
        return tuple(_coerce(key, v.strip() if isinstance(v, str) else v, kind()) for v in items)
    if default is None:
        return value
    raise TypeError(
        f"setting {key}: defaults of type {type(default).__name__} cannot be set "
        "from outside the unit"
    )


def _declarations() -> list[Experiment]:
    found: list[Experiment] = []
    for unit in catalogue.units():  # the units' packages, in order, as the catalogue finds them
        if unit.package_dir is not None and (unit.package_dir / "cluster.py").is_file():
            module = importlib.import_module(f"{unit.package}.cluster")
            found.extend(module.EXPERIMENTS)
    return found


_REGISTRY: dict[str, Experiment] | None = None


def experiments() -> dict[str, Experiment]:
    """Every exportable experiment, by name, in unit order."""
    global _REGISTRY
    if _REGISTRY is None:
        reg: dict[str, Experiment] = {}
        for exp in _declarations():
            if exp.name in reg:
                raise RuntimeError(f"two experiments are named {exp.name}")
            reg[exp.name] = exp
        _REGISTRY = reg
    return dict(_REGISTRY)


def get(name: str | Experiment) -> Experiment:
    """The experiment ``name`` (``u09.bytes``); a unit alone (``u09``) names its first one."""
    if isinstance(name, Experiment):
        return name
    reg = experiments()
    if isinstance(name, str) and name in reg:
        return reg[name]
    if isinstance(name, str):
        first = [e for e in reg.values() if e.unit == name]
        if first:
            return first[0]
    raise ValueError(
        f"experiment = {name!r}: expected one of {', '.join(reg)} (or a unit: "
        f"{', '.join(dict.fromkeys(e.unit for e in reg.values()))})"
    )
