"""The package's import rules (CONTRIBUTING.md, "Layout"), checked on the source text.

1. No unit imports another unit (what two units share lives in a mechanism layer).
2. Only plots and widgets draw: nothing outside ``units/*/plots.py``, ``units/*/widgets.py`` and
   ``viz/`` imports matplotlib or ipywidgets (so ranks and check cells never pay for them).
3. A unit's ``checks.py`` and its ``checks_<section>.py`` files import only the standard library,
   ``course_lib.grading`` and those section files at module level (heavier imports go inside the
   check functions), so a check cell imports fast.
4. Mechanism layers never import ``course_lib.units``.
5. No module imports itself through others: the static import graph of course_lib has no circle.
6. Every import follows the package order, :data:`LAYERS` (lowest first): a module imports its
   own layer and the layers below, never one above (but the pairs in :data:`UPWARD`).
7. A part of a package under ``parallel/`` imports its siblings, never its own package's front
   (the ``__init__`` that re-exports them): ``parallel.<pkg>`` sits in the parallel layer.
8. ``course_lib`` (the learner's package) never imports ``course_tools`` (the maintainers'
   tools: publishing, the exercise generator, benchmarks, the GPU check), which sits above it as
   the top layer: a lecture, an exercise, the grader and a rank run without it.

Every violation is reported with its file, line and import, all at once.

Rules 5, 6 and 8 read every ``import`` statement of both packages, wherever it is: at module level,
inside a function (a deferred import is still a dependency; deferring one is how a circle
hides) and under ``if TYPE_CHECKING:`` (a type is a
dependency of the design even when nothing imports it at run time). An import names the
module it reaches (``from course_lib.parallel import ddp`` is an edge to
``course_lib.parallel.ddp``, ``from course_lib.models import GPT`` one to the package front
``course_lib.models``); the parent packages Python imports on the way are not edges (or every
front that re-exports its parts would be a circle). Imports by name at run time
(``importlib.import_module(f"course_lib.units.{name}")``) are not seen.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"
TOOLS = ROOT / "course_tools"
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


# ---- 5 and 6: no circles, and the package order ----------------------------------------------

#: the package order, lowest first: each layer's names are the first names under course_lib/
#: (a package or a module; "__init__" is course_lib's own front). A module may import its own
#: layer and the layers below it. The maintainers' tools, the package course_tools (every module
#: of it), sit on top (rule 8).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("validate", ("validate", "catalogue")),  # pure Python: import nothing of the course
    ("vocabulary", ("shape", "dims")),  # one model shape, one parallel layout
    ("runtime", ("runtime", "ranks", "__init__")),
    ("models/data", ("models", "data")),
    ("measure", ("measure",)),
    ("techniques", ("techniques",)),
    ("parallel", ("parallel", "resilience")),
    ("virtual", ("virtual",)),
    ("plan", ("plan",)),
    ("viz", ("viz",)),
    ("kit", ("kit",)),  # what the units share: typed rows, sweeps, figures
    ("units", ("units",)),
    ("grading/cluster", ("grading", "grade", "cluster")),
    ("tools", ("course_tools",)),
)
#: imports up the order that the design asks for: (from layer, to name) -> why
UPWARD: dict[tuple[str, str], str] = {
    ("units", "grading"): "a unit's checks are written with the grading helpers (rule 3)",
    ("units", "cluster"): "a unit's cluster.py declares its torchrun experiments",
}

Graph = dict[str, dict[str, list[tuple[int, str]]]]  # module -> imported module -> (line, where)


def _module_names(root: pathlib.Path) -> dict[str, pathlib.Path]:
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _where(tree: ast.Module) -> dict[int, str]:
    """id(import node) -> "module", "function" or "typing" (under ``if TYPE_CHECKING:``)."""
    out: dict[int, str] = {}

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function" if where == "module" else where
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.body:
                    out.update({id(n): "typing" for n in ast.walk(sub)})
                for sub in child.orelse:
                    visit(sub, where)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                out.setdefault(id(child), here)
            visit(child, here)

    visit(tree, "module")
    return out


def module_graph(*roots: pathlib.Path) -> Graph:
    """The static import graph of the packages at ``roots`` (default: course_lib and
    course_tools; see the module docstring)."""
    names: dict[str, pathlib.Path] = {}
    for root in roots or (PACKAGE, TOOLS):
        names.update(_module_names(root))

    def resolve(name: str) -> str | None:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in names.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        where = _where(tree)
        edges = graph.setdefault(module, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target)
                if found is not None and found != module:
                    edges.setdefault(found, []).append((node.lineno, where[id(node)]))
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """Every circle of the graph, one per strongly connected component of more than one module:
    the shortest path from the component's first module back to itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for component in components:
        start = min(component)
        paths = {start: [start]}
        frontier = [start]
        circle = None
        while frontier and circle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph.get(v, {})):
                    if w == start:
                        circle = paths[v] + [start]
                        break
                    if w in component and w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
                if circle:
                    break
            frontier = nxt
        found.append(circle)
    return sorted(found)


def describe_cycle(graph: Graph, circle: list[str]) -> str:
    steps = [
        f"{a} (line {graph[a][b][0][0]}, {graph[a][b][0][1]} level) -> {b}"
        for a, b in zip(circle, circle[1:])
    ]
    return f"{circle[0]} imports itself through others: " + "; ".join(steps)


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == TOOLS.name:
        name = TOOLS.name
    else:
        name = parts[1] if len(parts) > 1 else "__init__"
    return next((layer for layer, names in LAYERS if name in names), None)


def order_violations(graph: Graph) -> list[str]:
    """Every import of a layer above the importer's (those in :data:`UPWARD` aside), and every
    module whose package has no place in :data:`LAYERS`."""
    rank = {layer: i for i, (layer, _) in enumerate(LAYERS)}
    order = " < ".join(layer for layer, _ in LAYERS)
    found = []
    for module in sorted(graph):
        mine = layer_of(module)
        if mine is None:
            found.append(f"{module}: its package has no place in LAYERS ({order}); add it")
            continue
        for target, where in sorted(graph[module].items()):
            theirs = layer_of(target)
            line, level = where[0]
            if module.split(".")[0] == PACKAGE.name and target.split(".")[0] == TOOLS.name:
                found.append(
                    f"{module}:{line} imports {target} ({level} level): course_lib never imports "
                    "course_tools (the learner's package runs without the maintainers' tools; "
                    "what a lecture or an exercise needs belongs in course_lib)"
                )
                continue
            if theirs is None or rank[theirs] <= rank[mine]:
                continue
            if (mine, target.split(".")[1]) in UPWARD:
                continue
            found.append(
                f"{module}:{line} imports {target} ({level} level): layer {mine} must not "
                f"import layer {theirs} above it (the order: {order})"
            )
    return found


@functools.cache
def _tree() -> Graph:
    return module_graph()


def test_no_module_imports_itself_through_others():
    graph = _tree()
    found = [describe_cycle(graph, c) for c in cycles(graph)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_every_import_follows_the_package_order():
    found = order_violations(_tree())
    assert not found, "imports against the package order:\n" + "\n".join(found)


def front_imports(graph: Graph) -> list[str]:
    """Every module of a package under ``parallel/`` (``parallel/zero/full.py``) that imports its
    own package's front (``course_lib.parallel.zero``): the front re-exports the parts, so a part
    imports the sibling that defines a name, or the front and its parts import each other."""
    found = []
    for module in sorted(graph):
        parts = module.split(".")
        if len(parts) != 4 or parts[1] != "parallel":
            continue
        front = ".".join(parts[:3])
        if front in graph[module]:
            line, level = graph[module][front][0]
            found.append(
                f"{module}:{line} imports its own package's front {front} ({level} level): "
                "import the sibling module that defines the name"
            )
    return found


def test_a_part_of_a_parallel_package_imports_its_siblings_not_its_front():
    found = front_imports(_tree())
    assert not found, "parts importing their front:\n" + "\n".join(found)


def test_a_planted_import_of_the_own_front_is_named(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "parallel/zero/__init__.py": "from course_lib.parallel.zero.common import Z\n",
            "parallel/zero/common.py": "Z = 1\n",
            "parallel/zero/full.py": "from course_lib.parallel.zero import Z\n"
            "from course_lib.parallel.ddp import D\n",
            "parallel/ddp/__init__.py": "D = 1\n",
        },
    )
    found = front_imports(module_graph(pkg))
    assert len(found) == 1 and "course_lib.parallel.zero.full:1" in found[0], found


def _graph(edges: str) -> Graph:
    """A small graph from "a>b b>c" (each edge at line 1, module level)."""
    graph: Graph = {}
    for edge in edges.split():
        a, b = edge.split(">")
        graph.setdefault(a, {}).setdefault(b, []).append((1, "module"))
        graph.setdefault(b, {})
    return graph


@pytest.mark.parametrize(
    "edges, expected",
    [
        ("a>b b>c", []),
        ("a>b b>a", [["a", "b", "a"]]),
        ("a>b b>c c>a c>d", [["a", "b", "c", "a"]]),
        ("a>b b>c c>b a>c", [["b", "c", "b"]]),  # a diamond around a circle of two
        ("a>b b>a c>d d>c", [["a", "b", "a"], ["c", "d", "c"]]),
        ("a>b a>c b>d c>d", []),  # a diamond is no circle
    ],
)
def test_the_cycle_check_on_small_graphs(edges, expected):
    assert cycles(_graph(edges)) == expected


def _package(
    tmp_path: pathlib.Path, files: dict[str, str], name: str = "course_lib"
) -> pathlib.Path:
    pkg = tmp_path / name
    for relpath, source in files.items():
        (pkg / relpath).parent.mkdir(parents=True, exist_ok=True)
        (pkg / relpath).write_text(source)
    return pkg


@pytest.mark.parametrize(
    "files",
    [
        {  # module level both ways
            "parallel/a.py": "from course_lib.parallel.b import g\n",
            "parallel/b.py": "from course_lib.parallel import a\n",
        },
        {  # the way back deferred into a function (pipeline <-> pipeline_run's shape)
            "parallel/a.py": "from course_lib.parallel.b import g\n",
            "parallel/b.py": "def g():\n    from course_lib.parallel.a import f\n",
        },
        {  # the way back only for types
            "measure/a.py": "from . import b\n",
            "measure/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from course_lib.measure.a import A\n",
        },
        {  # a package front and its part
            "models/__init__.py": "from course_lib.models.llama import Llama\n",
            "models/llama.py": "from course_lib.models import check\n",
        },
        {  # across packages, through a third module
            "grading/x.py": "def f():\n    from course_lib.cluster import nav\n",
            "cluster/nav.py": "from course_lib.cluster.site import g\n",
            "cluster/site.py": "def g():\n    from course_lib.grading import x\n",
        },
    ],
)
def test_a_planted_circle_is_named(tmp_path, files):
    graph = module_graph(_package(tmp_path, files))
    (circle,) = cycles(graph)
    assert len(circle) == len(files) + 1 and circle[0] == circle[-1]
    assert {m.removeprefix("course_lib.").replace(".", "/") for m in circle} <= {
        f.removesuffix(".py").removesuffix("/__init__") for f in files
    }
    assert "imports itself through others" in describe_cycle(graph, circle)


@pytest.mark.parametrize(
    "relpath, source, target, mine, theirs",
    [
        (
            "measure/comm.py",
            "from course_lib.parallel.groups import group_info\n",
            "parallel/groups.py",
            "measure",
            "parallel",
        ),
        (
            "runtime/x.py",
            "def f():\n    from course_lib.models import GPT\n",
            "models/__init__.py",
            "runtime",
            "models/data",
        ),
        (
            "validate.py",
            "from course_lib.runtime import launch\n",
            "runtime/launch.py",
            "validate",
            "runtime",
        ),
        (
            "plan/launch.py",
            "def f():\n    from course_lib.cluster import slurm_script\n",
            "cluster/__init__.py",
            "plan",
            "grading/cluster",
        ),
        (
            "parallel/x.py",
            "from course_lib import virtual\n",
            "virtual/__init__.py",
            "parallel",
            "virtual",
        ),
        (
            "units/u01_a/run.py",
            "import course_lib.grade\n",
            "grade.py",
            "units",
            "grading/cluster",
        ),
    ],
)
def test_a_planted_import_against_the_order_is_named(
    tmp_path, relpath, source, target, mine, theirs
):
    found = order_violations(module_graph(_package(tmp_path, {relpath: source, target: ""})))
    assert len(found) == 1, found
    assert f"layer {mine} must not import layer {theirs} above it" in found[0], found


def test_imports_down_the_order_and_the_named_upward_pairs_pass(tmp_path):
    pkg = _package(
        tmp_path,
        {
            "parallel/x.py": "from course_lib.measure import timing\nfrom course_lib import validate\n",
            "units/u01_a/checks.py": "from course_lib.grading.core import passed\n",
            "units/u01_a/cluster.py": "from course_lib.cluster import Experiment\n",
            "grading/x.py": "from course_lib.units import u01_a\n",
        },
    )
    tools = _package(
        tmp_path,
        {
            "gpu_check/x.py": "from course_lib.units import u01_a\nfrom course_lib import grade\n",
            "publish/site.py": "from course_tools.gpu_check import x\n",
        },
        name="course_tools",
    )
    assert order_violations(module_graph(pkg, tools)) == []


@pytest.mark.parametrize(
    "relpath, source",
    [
        ("grading/x.py", "from course_tools.exercises import build_exercises\n"),
        ("units/u01_a/run.py", "def f():\n    import course_tools.publish.site\n"),
        (
            "validate.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import course_tools\n",
        ),
    ],
)
def test_a_planted_import_of_the_tools_is_named(tmp_path, relpath, source):
    """Rule 8: course_lib imports nothing of course_tools, at any level, from any layer."""
    pkg = _package(tmp_path, {relpath: source})
    tools = _package(
        tmp_path,
        {"__init__.py": "", "exercises.py": "", "publish/__init__.py": "", "publish/site.py": ""},
        name="course_tools",
    )
    found = order_violations(module_graph(pkg, tools))
    assert len(found) == 1, found
    module = "course_lib." + relpath.removesuffix(".py").replace("/", ".")
    assert found[0].startswith(module) and "course_lib never imports course_tools" in found[0]


def test_the_tools_are_a_layer_of_their_own_above_the_package():
    assert LAYERS[-1] == ("tools", (TOOLS.name,))
    assert layer_of("course_tools.publish.site") == "tools"
    graph = _tree()
    assert any(m.startswith("course_tools.") for m in graph), "course_tools is in the graph"
    assert not [m for m in graph if m.startswith("course_lib.") and layer_of(m) == "tools"]


def test_a_package_without_a_layer_is_named(tmp_path):
    found = order_violations(module_graph(_package(tmp_path, {"newthing/x.py": "import os\n"})))
    assert found == [
        f"course_lib.newthing.x: its package has no place in LAYERS "
        f"({' < '.join(layer for layer, _ in LAYERS)}); add it"
    ]
