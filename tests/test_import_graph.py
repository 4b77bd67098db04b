"""The core packages form a directed acyclic graph: no two of them import each other, neither at
module level nor inside a function nor under ``TYPE_CHECKING`` (every ``import`` statement of the
source counts), and the objective's arithmetic sits below :mod:`rpm.models`, :class:`RPMELBO`
above it."""

import ast
import collections
from pathlib import Path

import rpm

PACKAGE_ROOT = Path(rpm.__file__).parent
#: The core's units: a subpackage, or a top-level module of the core (private ones included).
CORE = ("ops", "distributions", "marginals", "priors", "_objective", "models", "inference", "mi",
        "losses", "nn", "distributed", "_validation", "_pyro_compat")


def unit_of(module: str) -> str | None:
    """The core unit that an absolute module name ``rpm.X...`` belongs to, or None."""
    parts = module.split(".")
    if parts[0] != "rpm" or len(parts) < 2 or parts[1] not in CORE:
        return None
    return parts[1]


def imported_modules(path: Path, package: str) -> list[str]:
    """Every module an ``import`` statement of the file names, relative imports resolved."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            # `from rpm import priors` imports the subpackage rpm.priors
            names += [f"{module}.{alias.name}" for alias in node.names]
    return names


def core_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for unit in CORE:
        path = PACKAGE_ROOT / unit
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]
        for file in files:
            relative = file.relative_to(PACKAGE_ROOT.parent).with_suffix("")
            package = ".".join(relative.parts[:-1] if relative.name != "__init__" else relative.parts)
            for module in imported_modules(file, package):
                target = unit_of(module)
                if target is not None and target != unit:
                    edges[unit].add(target)
    return edges


def test_no_two_core_units_import_each_other():
    edges = core_edges()
    both_ways = sorted((a, b) for a in edges for b in edges[a] if a < b and a in edges.get(b, ()))
    assert both_ways == []


def test_the_core_import_graph_is_acyclic():
    edges = core_edges()
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for target in sorted(edges.get(unit, ())):
            assert state.get(target) != 1, "import cycle: " + " -> ".join(path + [unit, target])
            if target not in state:
                visit(target, path + [unit])
        state[unit] = 2

    for unit in CORE:
        if unit not in state:
            visit(unit, [])


def test_the_objective_sits_below_the_models_and_the_elbo_above():
    edges = core_edges()
    assert "_objective" in edges["models"]
    assert "models" in edges["inference"]
    assert not edges["_objective"] & {"models", "inference", "losses", "mi"}
    assert not edges["models"] & {"inference", "losses"}


def test_the_graph_sees_imports_inside_functions(tmp_path):
    """The parser counts an import written inside a function (the form a cycle hid in)."""
    source = tmp_path / "module.py"
    source.write_text("def f():\n    from rpm.models._views import stack\n    return stack\n")
    assert "rpm.models._views" in imported_modules(source, "rpm.ops")
