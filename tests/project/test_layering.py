"""The package structure that ruff's banned-api cannot see, checked on every import of envforge's
own modules (module level, inside functions and under `TYPE_CHECKING` alike):

- within a package, its subpackages in the order its `__init__` declares ("Subpackages, each
  importing only those before it: ..."): no module imports a subpackage to its right;
- no import cycle anywhere in envforge (Tarjan's strongly connected components over the graph);
- outside a package, only its public surface (its `__init__`) is imported, not its modules, but
  for the exceptions listed here and the white-box tests `tests/ruff.toml` exempts from TID251;
- the curated surfaces load nothing heavy on import.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.paths import REPO

FOLDERS = {
    "envforge": REPO / "api",
    "envforge.server": REPO / "server",
    "envforge.synth": REPO / "synth",
    "envforge.harness": REPO / "harness",
    "envforge.trainer": REPO / "trainer",
    "envforge.integrations": REPO / "integrations",
    "envforge.cli": REPO / "cli",
}
"""Where each package's files live (pyproject's package-dir); subpackages are folders below."""

SURFACES = (
    "envforge.server",
    "envforge.synth",
    "envforge.synth.envsynth",
    "envforge.harness",
    "envforge.trainer",
)
"""Packages used from outside only through their `__init__` (the top-level `envforge` too: below);
`envforge.integrations` is not one: its modules, one per framework, are its public names."""

REACH_IN = {("envforge.synth", "envforge.server.sandbox")}
"""(importer's package, what it may import past the surface): envsynth's seed-generator runner
shares the OS sandbox (`confinement`, `confinement_inner`)."""

ORDER_LINE = re.compile(r"Subpackages, each importing only those before it:\s*([^.]+)\.")


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def _modules() -> dict[str, Module]:
    """Every module of envforge by import name; a folder without `__init__.py` is data (the τ²
    port's env code) and is left out, as mypy leaves it out."""
    found: dict[str, Module] = {}
    for top, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).parts
            if any(not (folder.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(len(parts))):
                continue
            if parts[0] in {"server", "synth", "harness", "trainer", "cli"} and top == "envforge":
                continue
            names = [*parts[:-1], *([] if path.stem == "__init__" else [path.stem])]
            name = ".".join([top, *names])
            found[name] = Module(name, path, path.stem == "__init__")
    return found


MODULES = _modules()


@dataclass(frozen=True)
class Import:
    target: str
    line: int


def _package_of(module: Module) -> str:
    return module.name if module.is_package else module.name.rpartition(".")[0]


def _imports(path: Path, package: str | None) -> Iterator[Import]:
    """The envforge modules `path` imports anywhere in it, resolved to names in `MODULES`
    (`from pkg import name` counts as importing `pkg.name` when that is a module)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield Import(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if package is None:
                    continue
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if not target.startswith("envforge"):
                continue
            for alias in node.names:
                if f"{target}.{alias.name}" in MODULES:
                    yield Import(f"{target}.{alias.name}", node.lineno)
                elif target in MODULES:
                    yield Import(target, node.lineno)


GRAPH = {name: list(_imports(m.path, _package_of(m))) for name, m in MODULES.items()}


def _declared_orders() -> dict[str, list[str]]:
    """package -> its subpackages left to right, as the line in its `__init__` docstring names them."""
    orders: dict[str, list[str]] = {}
    for name, module in MODULES.items():
        if module.is_package:
            doc = " ".join(
                (ast.get_docstring(ast.parse(module.path.read_text(encoding="utf-8"))) or "").split()
            )
            if found := ORDER_LINE.search(doc):
                orders[name] = [part.strip() for part in found.group(1).split(",")]
    return orders


ORDERS = _declared_orders()


def _subpackages(package: str) -> set[str]:
    return {
        m.name.rpartition(".")[2]
        for m in MODULES.values()
        if m.is_package and m.name.rpartition(".")[0] == package
    }


def test_every_package_with_subpackages_declares_their_order() -> None:
    """A new subpackage has a place in its package's order before anything can check it."""
    packages = {m.name for m in MODULES.values() if m.is_package and _subpackages(m.name)} - {"envforge"}
    assert {p: sorted(_subpackages(p)) for p in packages} == {p: sorted(ORDERS.get(p, [])) for p in packages}


def wrong_way_imports(package: str, graph: dict[str, list[Import]]) -> list[str]:
    """Each import in `graph` by a module of one of `package`'s subpackages of a subpackage to its right."""
    rank = {f"{package}.{sub}": i for i, sub in enumerate(ORDERS[package])}

    def home(name: str) -> str | None:
        return next((sub for sub in rank if name == sub or name.startswith(sub + ".")), None)

    wrong = []
    for name, imports in graph.items():
        if (here := home(name)) is None:
            continue
        for imp in imports:
            if (there := home(imp.target)) is not None and rank[there] > rank[here]:
                wrong.append(
                    f"{MODULES[name].path.relative_to(REPO)}:{imp.line} imports {imp.target}: "
                    f"{there.rpartition('.')[2]} sits right of {here.rpartition('.')[2]}"
                )
    return wrong


@pytest.mark.parametrize("package", sorted(ORDERS))
def test_no_module_imports_a_subpackage_to_its_right(package: str) -> None:
    assert wrong_way_imports(package, GRAPH) == []


def import_cycles(graph: dict[str, list[Import]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative),
    each as the modules of one cycle through it in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for imp in edges:
                if imp.target not in graph:
                    continue
                if imp.target not in index:
                    index[imp.target] = low[imp.target] = len(index)
                    stack.append(imp.target)
                    on_stack.add(imp.target)
                    work.append((imp.target, iter(graph[imp.target])))
                    break
                if imp.target in on_stack:
                    low[node] = min(low[node], index[imp.target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        components.append(_one_cycle(set(component), graph))
    return components


def _one_cycle(component: set[str], graph: dict[str, list[Import]]) -> list[str]:
    """A shortest cycle through the component's first module (by name), for the failure message."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for imp in graph[node]:
            if imp.target == start:
                return [*paths[node], start]
            if imp.target in component and imp.target not in paths:
                paths[imp.target] = [*paths[node], imp.target]
                queue.append(imp.target)
    return sorted(component)


def test_no_import_cycle_anywhere_in_envforge() -> None:
    """Module level and function level alike: an import inside a function that closes a cycle
    only hides it from the interpreter until that function runs."""
    assert [" -> ".join(cycle) for cycle in import_cycles(GRAPH)] == []


def _white_box_tests() -> set[Path]:
    """The test files `tests/ruff.toml` lets past the surfaces (TID251), each with its reason there."""
    lint = tomllib.loads((REPO / "tests" / "ruff.toml").read_text(encoding="utf-8"))["lint"]
    return {REPO / "tests" / f for f, rules in lint.get("per-file-ignores", {}).items() if "TID251" in rules}


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _api_module(name: str | None) -> bool:
    """A module of the top-level `envforge` (api/), its `__init__` included."""
    return name in MODULES and MODULES[name].path.parent == FOLDERS["envforge"]


def past_the_surfaces(importers: dict[Path, tuple[str | None, list[Import]]]) -> list[str]:
    """Imports of a package's modules from outside it: `importers` maps a file to its module
    name (None: a test or a benchmark) and its imports."""
    wrong = []
    for path, (name, imports) in importers.items():
        for imp in imports:
            surface = max((s for s in SURFACES if _within(imp.target, s)), key=len, default=None)
            if surface is not None and imp.target != surface and not (name and _within(name, surface)):
                if not any(name and _within(name, a) and _within(imp.target, b) for a, b in REACH_IN):
                    wrong.append(f"{path.relative_to(REPO)}:{imp.line} imports {imp.target} past {surface}")
            elif _api_module(imp.target) and imp.target != "envforge" and not _api_module(name):
                wrong.append(f"{path.relative_to(REPO)}:{imp.line} imports {imp.target} past envforge")
    return list(dict.fromkeys(wrong))


def _importers() -> dict[Path, tuple[str | None, list[Import]]]:
    found: dict[Path, tuple[str | None, list[Import]]] = {
        m.path: (name, GRAPH[name]) for name, m in MODULES.items()
    }
    exempt = _white_box_tests()
    for folder in ("tests", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path not in exempt:
                found[path] = (None, list(_imports(path, None)))
    return found


def test_outside_a_package_only_its_surface_is_imported() -> None:
    """Every package's modules, benchmarks and tests included: what a new module adds is
    reachable only through its package's `__init__`, with no ban list to extend."""
    assert past_the_surfaces(_importers()) == []


def test_the_checks_catch_a_planted_wrong_way_import() -> None:
    """The checks above, on the real graph with one import added that the core must never make
    (the error module importing the MCP client): both the order and the cycle finder see it."""
    graph = {name: list(imports) for name, imports in GRAPH.items()}
    graph["envforge.server.core.errors"].append(Import("envforge.server.transports.client", 1))
    assert wrong_way_imports("envforge.server", graph) == [
        "server/core/errors.py:1 imports envforge.server.transports.client: transports sits right of core"
    ]
    assert any("envforge.server.core.errors" in cycle for cycle in import_cycles(graph))
    importers = {
        MODULES["envforge.harness"].path: ("envforge.harness", [Import("envforge.server.core.db", 1)])
    }
    assert past_the_surfaces(importers) == [
        "harness/__init__.py:1 imports envforge.server.core.db past envforge.server"
    ]


def test_the_package_surfaces_import_no_ml_stack_and_no_model_client() -> None:
    code = (
        "import sys, envforge.synth, envforge.harness, envforge.trainer\n"
        "from envforge.trainer import RolloutConfig, erpo_advantages, RunOptions\n"
        "heavy = [m for m in ('torch', 'transformers', 'litellm', 'ray', 'vllm') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""


LEFT_OF_THE_API = ("server", "synth", "harness", "trainer", "integrations")


def _top_level_imports(path: Path) -> list[str]:
    """Imports of the top-level `envforge` (api/) itself or of its modules, by absolute name."""
    own = {p.stem for p in (REPO / "api").glob("*.py")} - {"__init__"}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        found += [n for n in names if n == "envforge" or n.split(".")[:2] in (["envforge", m] for m in own)]
    return found


@pytest.mark.parametrize("package", LEFT_OF_THE_API)
def test_the_packages_left_of_the_api_never_import_it(package: str) -> None:
    """ruff's banned-api bans a name with everything under it, so `envforge` cannot be banned
    without banning `envforge.server`: the one-way rule for the top level is checked here."""
    offenders = {
        str(p.relative_to(REPO)): found
        for p in (REPO / package).rglob("*.py")
        if (found := _top_level_imports(p))
    }
    assert offenders == {}


def test_the_api_imports_no_cli() -> None:
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "api").glob("*.py")
        if "envforge.cli" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_importing_envforge_loads_nothing_and_its_names_load_only_their_own_stack() -> None:
    """`import envforge` is free; evaluation and synthesis from it load no ML stack, and the
    model client only with the harness that needs it."""
    code = (
        "import sys, envforge\n"
        "bare = sorted(m for m in sys.modules if m.startswith(('envforge.', 'mcp', 'litellm', 'torch')))\n"
        "envforge.run_episode, envforge.check_tasks, envforge.evaluate, envforge.RunOptions\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'ray', 'vllm') if m in sys.modules]\n"
        "heavy += [m for m in ('openenv', 'gradio') if m in sys.modules]\n"
        "heavy += [m for m in sys.modules if m.startswith('envforge.integrations')]\n"
        "print(','.join(bare) + '|' + ','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "|"
