"""No import cycles in ratchet/, between modules or between the children of any package.

The imports are read with ast (absolute, relative, and those inside functions, which hide a
cycle from Python but not from the design), so nothing is imported to check them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package (a package is its __init__)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, is_package: bool) -> list[tuple[str, list[str]]]:
    """(module named, the names taken from it) for every import statement of a module, at any
    depth; relative imports resolved against the module's package."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[:len(here) - node.level + 1] if node.level else []
            source = ".".join(base + ([node.module] if node.module else []))
            out.append((source, [alias.name for alias in node.names]))
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports: `from p import m` names the module p.m
    where there is one, else p; a dotted name stands for its longest known prefix."""
    modules = module_names(root, package)

    def known(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for name, path in modules.items():
        targets = set()
        for source, names in imports(name, path, path.name == "__init__.py"):
            submodules = [f"{source}.{n}" for n in names if f"{source}.{n}" in modules]
            if len(submodules) < len(names) or not names:  # names defined in the module itself
                targets.add(known(source))
            targets.update(submodules)
        graph[name] = targets - {None, name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each strongly connected component of more than one node, as one cycle through it
    (a -> b -> a), followed by the component's other members when there are more."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan; the graphs are small, recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    out = []
    for component in components:
        cycle = _cycle_in(graph, component)
        rest = sorted(component - set(cycle))
        out.append(" -> ".join(cycle) + (f" (with {', '.join(rest)})" if rest else ""))
    return sorted(out)


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first node, as a path that returns to it."""
    start = min(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & component):
            if w == start:
                return path + [start]
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no cycle in component {component}")


def package_graphs(graph: dict[str, set[str]]) -> dict[str, dict[str, set[str]]]:
    """Package -> the graph among its direct children, each child standing for its subtree."""
    packages = {m.rpartition(".")[0] for m in graph if "." in m}
    out = {}
    for package in sorted(packages):
        prefix = package + "."

        def child(module: str) -> str | None:
            if not module.startswith(prefix):
                return None
            return prefix + module[len(prefix):].split(".")[0]

        children: dict[str, set[str]] = {}
        for source, targets in graph.items():
            a = child(source)
            if a is None:
                continue
            children.setdefault(a, set())
            for target in targets:
                b = child(target)
                if b is not None and b != a:
                    children[a].add(b)
        out[package] = children
    return out


def module_cycles(root: Path, package: str) -> list[str]:
    return cycles(import_graph(root, package))


def package_cycles(root: Path, package: str) -> list[str]:
    return [f"in {name}: {c}"
            for name, graph in package_graphs(import_graph(root, package)).items()
            for c in cycles(graph)]


def test_no_module_level_import_cycles():
    found = module_cycles(ROOT, "ratchet")
    assert not found, "import cycles between modules:\n  " + "\n  ".join(found)


def test_no_package_level_import_cycles():
    found = package_cycles(ROOT, "ratchet")
    assert not found, "import cycles between the children of a package:\n  " + "\n  ".join(found)


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_planted_cycles_are_found_and_named(tmp_path):
    """A fake package: a module cycle through a relative import inside a function, and a
    package-level cycle (a.x -> b.y, b.z -> a.w) with no module cycle in it."""
    write(tmp_path, {
        "pkg/__init__.py": "from . import one\n",  # a package importing its child: no cycle
        "pkg/one.py": "import pkg.two\n",
        "pkg/two.py": "def f():\n    from .one import g\n",
        "pkg/a/__init__.py": "", "pkg/a/x.py": "from pkg.b import y\n", "pkg/a/w.py": "",
        "pkg/b/__init__.py": "", "pkg/b/y.py": "", "pkg/b/z.py": "from ..a.w import thing\n",
        "pkg/c.py": "import pkg.a.x\nimport os\n",
    })
    assert module_cycles(tmp_path, "pkg") == ["pkg.one -> pkg.two -> pkg.one"]
    assert package_cycles(tmp_path, "pkg") == ["in pkg: pkg.a -> pkg.b -> pkg.a",
                                               "in pkg: pkg.one -> pkg.two -> pkg.one"]
    write(tmp_path, {"pkg/two.py": "", "pkg/b/z.py": ""})
    assert module_cycles(tmp_path, "pkg") == [] and package_cycles(tmp_path, "pkg") == []
