"""The package's layout rules, checked on its source with ``ast``: no import cycles, data
flowing one way (specs -> simulator -> search -> cli), modules of about 400 lines at most, and
CLI modules that share only public names."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1] / "paraplan"
MAX_LINES = 400
REASON = "# longer than 400 lines:"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _runtime_nodes(tree: ast.Module):
    """Every node except what sits under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if (isinstance(child, ast.If) and isinstance(child.test, ast.Name)
                    and child.test.id == "TYPE_CHECKING"):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def _imports(name: str, path: Path) -> list[tuple[str, str]]:
    """(module imported, name imported or '') for every import a module runs, top-level or
    inside a function; ``from pkg import sub`` resolves to the submodule ``pkg.sub``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.startswith("paraplan")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("paraplan"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub, "") if sub in MODULES else (target, alias.name))
    return out


def _graph() -> nx.DiGraph:
    graph = nx.DiGraph()
    for name, path in MODULES.items():
        graph.add_node(name)
        for target, _ in _imports(name, path):
            graph.add_edge(name, target)
    return graph


def test_no_import_cycle():
    cycles = sorted(nx.simple_cycles(_graph()), key=len)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c + c[:1]) for c in cycles[:5])


def test_cycle_finder_sees_a_cycle():
    # The check itself can fail: two modules importing each other are a cycle.
    graph = nx.DiGraph([("a", "b"), ("b", "a")])
    assert list(nx.simple_cycles(graph))


# What each layer may import (DESIGN: specs -> simulator -> StepReport; search asks the
# simulator; nothing below the CLI imports it).
LAYERS = {
    "paraplan.specs": ("paraplan.specs",),
    "paraplan.simulator": ("paraplan.specs", "paraplan.simulator"),
    "paraplan.search": ("paraplan.specs", "paraplan.simulator", "paraplan.search"),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_data_flows_one_way(layer):
    allowed = LAYERS[layer]
    bad = [f"{name} imports {target}" for name, path in MODULES.items()
           if name == layer or name.startswith(layer + ".")
           for target, _ in _imports(name, path)
           if not any(target == a or target.startswith(a + ".") for a in allowed)]
    assert not bad, "; ".join(bad)


def test_nothing_outside_the_cli_imports_it():
    bad = [f"{name} imports {target}" for name, path in MODULES.items()
           if not name.startswith("paraplan.cli") and name != "paraplan.__main__"
           for target, _ in _imports(name, path) if target.startswith("paraplan.cli")]
    assert not bad, "; ".join(bad)


def test_no_module_imports_its_own_package():
    # Upward imports (a module reading names from the package that contains it) are how
    # circles start: the package's __init__ imports the module first.
    bad = [f"{name} imports {target}" for name, path in MODULES.items()
           for target, _ in _imports(name, path)
           if name.startswith(target + ".")]
    assert not bad, "; ".join(bad)


def test_cli_modules_share_only_public_names():
    bad = [f"{name} imports {target}.{what}" for name, path in MODULES.items()
           if name.startswith("paraplan.cli")
           for target, what in _imports(name, path)
           if target.startswith("paraplan.cli") and what.startswith("_")]
    assert not bad, "; ".join(bad)


def test_modules_are_about_400_lines_or_say_why():
    long = []
    for name, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        if len(lines) > MAX_LINES and not any(line.startswith(REASON) for line in lines[:40]):
            long.append(f"{name} ({len(lines)} lines)")
    assert not long, f"over {MAX_LINES} lines without a '{REASON} ...' line: {', '.join(long)}"
