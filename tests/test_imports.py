"""The three packages import one way, plainly: no cycles, no string imports, nothing upward.

As README.md's "What is where" table says: ``algorithms`` uses ``collectives`` and ``minidl``;
``minidl`` never imports ``collectives`` or ``algorithms``; ``collectives`` never imports ``minidl``
or ``algorithms``.
Inside a package, too, imports go one way: two modules that import each other are one idea
in two files (or a third module they both need). And every import is written as an import
statement, so the graph below is the whole truth: no ``importlib.import_module``, no
``__import__``, no module-level ``__getattr__`` that loads modules by name.

The graph is read from the source with ``ast`` (no module is imported): every ``import x`` and
``from x import y`` counts, at module level or inside a function, relative imports resolved.
``from package import name`` is an edge to ``package.name`` where that is a module, else to
``package`` itself. Importing ``a.b.c`` also runs ``a/__init__.py`` and ``a/b/__init__.py``;
those implicit edges are left out (every submodule has them, and a package's ``__init__``
importing its own submodules is no cycle). Module names come from the file tree, so the test
needs no list of files.
"""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("minidl", "collectives", "algorithms")
# package -> the packages it must never import
FORBIDDEN = {"minidl": ("collectives", "algorithms"), "collectives": ("minidl", "algorithms")}


def module_files(root=ROOT, packages=PACKAGES):
    """{dotted module name: path} for every .py file under the packages."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _resolve(module, path, node):
    """The absolute module name that ``from ... import`` node ``node`` in ``module`` names."""
    if node.level == 0:
        return node.module
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module, path, modules):
    """[(imported module, line)] for the package modules that ``module`` imports."""
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            edges += [(alias.name, node.lineno) for alias in node.names if alias.name in modules]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            for alias in node.names:
                target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                if target in modules:
                    edges.append((target, node.lineno))
    return edges


def import_graph(root=ROOT, packages=PACKAGES):
    """{module: {imported module: first line}} over the packages."""
    modules = module_files(root, packages)
    graph = {}
    for module, path in modules.items():
        graph[module] = {}
        for target, line in imports_of(module, path, modules):
            graph[module].setdefault(target, line)
    return graph, modules


def cycles(graph):
    """One cycle [a, b, ..., a] for every strongly connected component that has one (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(_cycle_through(graph, component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _cycle_through(graph, component):
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target == start:
                    return paths[node] + [start]
                if target in component and target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def describe(cycle, graph, modules, root=ROOT):
    steps = [f"{a} ({modules[a].relative_to(root)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps + [cycle[-1]])


def string_imports(path):
    """[(line, what)] for importlib.import_module, __import__ and a module-level __getattr__ in one file."""
    tree = ast.parse(path.read_text(), str(path))
    found = [(node.lineno, "module-level __getattr__") for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            function = node.func
            name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, f"{name}(...)"))
        elif isinstance(node, ast.ImportFrom) and node.module == "importlib" and node.level == 0:
            found += [(node.lineno, "from importlib import import_module")
                      for alias in node.names if alias.name == "import_module"]
    return found


@pytest.fixture(scope="module")
def graph():
    return import_graph()


def test_the_graph_sees_every_package_and_their_known_imports(graph):
    """The reader of the source works: each package has modules, and imports everyone can see are found."""
    edges, modules = graph
    for package in PACKAGES:
        assert package in modules and sum(name.startswith(package + ".") for name in modules) > 3
    assert "minidl.tensor" in edges["minidl.functional"]            # from minidl.tensor import Tensor, result
    assert "minidl.conv.im2col" in edges["minidl.conv.im2col_blocked"]
    assert any(target.startswith("collectives") for source in edges if source.startswith("algorithms")
               for target in edges[source])


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_form_no_cycle(graph, package):
    edges, modules = graph
    found = [describe(cycle, edges, modules) for cycle in cycles(edges) if cycle[0].split(".")[0] == package]
    assert not found, f"import cycles in {package}/:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_imported_by_a_string(package):
    found = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in module_files(packages=(package,)).values()
             for line, what in string_imports(path)]
    assert not found, "import by name instead of an import statement:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_nothing_imports_upward(graph, package):
    edges, modules = graph
    found = [f"{modules[source].relative_to(ROOT)}:{line}: imports {target}"
             for source in edges if source.split(".")[0] == package
             for target, line in edges[source].items() if target.split(".")[0] in FORBIDDEN[package]]
    assert not found, f"{package} must not import {' or '.join(FORBIDDEN[package])}:\n  " + "\n  ".join(found)
