"""The layering you can draw: eagle <- data_prep <- train <- evaluation <- experiments, no import
cycles, and no file name used in two places.

Every import counts, at module level or inside a function: a lazy import is still a
dependency. `python tests/test_layering.py [ROOT]` prints the package graph and its edges.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

LAYERS = ("eagle", "data_prep", "train", "evaluation", "experiments")  # lowest first: a package imports only those before it
ROOT = Path(__file__).resolve().parent.parent


def module_imports(root: Path = ROOT, packages=LAYERS) -> dict[str, set[str]]:
    """{module: the project modules it imports}, e.g. {"train.trainer": {"eagle.heads.checkpoint", ...}}."""
    files = {".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): f
             for p in packages if (root / p).is_dir() for f in (root / p).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)
        graph[module] = {n for n in names if n in files and n != module}
    return graph


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """(importing package, imported package) -> how many module-level import pairs."""
    edges: dict[tuple[str, str], int] = defaultdict(int)
    for module, imported in graph.items():
        for other in imported:
            a, b = module.split(".")[0], other.split(".")[0]
            if a != b:
                edges[(a, b)] += 1
    return dict(edges)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def back_edges(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a package to one above it in LAYERS (or to a top-level package outside them)."""
    rank = {p: i for i, p in enumerate(LAYERS)}
    return sorted(f"{m} -> {o}" for m, imported in graph.items() for o in imported
                  if rank[o.split(".")[0]] > rank[m.split(".")[0]])


def test_packages_import_only_the_layers_below_them():
    graph = module_imports()
    assert set(m.split(".")[0] for m in graph) == set(LAYERS)
    assert back_edges(graph) == []


def test_no_import_cycles_between_modules():
    assert cycles(module_imports()) == []


def shared_file_names(root: Path = ROOT, packages=LAYERS) -> dict[str, list[str]]:
    """{file name: its paths} for the names (dunder files aside) that occur more than once in the packages."""
    paths: dict[str, list[str]] = defaultdict(list)
    for f in sorted(f for p in packages for f in (root / p).rglob("*.py")):
        if not f.name.startswith("__"):
            paths[f.name].append(f.relative_to(root).as_posix())
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_no_two_modules_share_a_file_name():
    """A file name says which module it is, whichever package it sits in."""
    assert shared_file_names() == {}


def test_the_checks_see_a_back_edge_and_a_cycle(tmp_path):
    """The checks themselves: a planted back-edge, a planted cycle and a planted shared file name are
    all reported."""
    for package in LAYERS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "eagle" / "a.py").write_text("def f():\n    from train.b import g\n")  # lazy, still an edge
    (tmp_path / "train" / "b.py").write_text("from eagle.a import f\n")
    graph = module_imports(tmp_path)
    assert back_edges(graph) == ["eagle.a -> train.b"]
    assert cycles(graph) == [["eagle.a", "train.b"]]
    (tmp_path / "experiments" / "b.py").write_text("")
    assert shared_file_names(tmp_path) == {"b.py": ["experiments/b.py", "train/b.py"]}


if __name__ == "__main__":
    g = module_imports(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT,
                       packages=[p.name for p in Path(sys.argv[1] if len(sys.argv) > 1 else ROOT).iterdir()
                                 if (p / "__init__.py").exists() and p.name != "tests"])
    for (a, b), n in sorted(package_edges(g).items()):
        print(f"{a} -> {b}: {n}")
    print("cycles:", cycles(g) or "none")
