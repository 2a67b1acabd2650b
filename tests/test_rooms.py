"""The house a contributor moves into: every folder's map names each of its modules, and the rooms
import one way.

- Package maps: each package's ``__init__.py`` docstring names every module (``name.py``, or the
  module in backquotes) and every sub-package (``name/``) beside it, and ``python -m <package>``
  where it has a ``__main__.py``. The papers at the top of algorithms/ are named by README.md's table
  instead (tests/test_readme.py holds that table to the runnable modules).
- algorithms/: core/ < shards/ < ps/ < sandblaster/ < the papers < the commands that run or measure
  several of them (compare.py, bench.py, memory/). A module imports only its own rank and below: no
  arrow runs back up. shards/ (how the memory-saving methods cut a model's state) stands on core/ alone;
  the papers and memory/ import it. Papers may build on each other's hearts (async EASGD on EASGD's
  elastic step).
- collectives/: the tools and the extensions (bench/, sim/, cluster/, compression/) stand on the
  algorithms, their machinery and the model (model/): nothing outside such a room imports into it.
"""
import ast
import re
from pathlib import Path

import pytest

from tests.test_imports import import_graph

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("minidl", "collectives", "algorithms")


def readme_papers(readme=ROOT / "README.md"):
    return set(re.findall(r"^\| `algorithms\.(\w+)`", readme.read_text(), re.M))


def unnamed(package_dir, exempt=()):
    """The modules and sub-packages of ``package_dir`` its ``__init__`` docstring does not name."""
    doc = ast.get_docstring(ast.parse((package_dir / "__init__.py").read_text())) or ""
    missing = []
    for path in sorted(package_dir.iterdir()):
        if path.name.startswith((".", "__pycache__")) or path.stem in exempt:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            if f"{path.name}/" not in doc:
                missing.append(f"{path.name}/")
        elif path.suffix == ".py" and path.name == "__main__.py":
            dotted = ".".join(package_dir.relative_to(ROOT).parts)
            if f"python -m {dotted}" not in doc:
                missing.append("__main__.py (python -m " + dotted + ")")
        elif path.suffix == ".py" and path.name != "__init__.py":
            if not re.search(rf"(?<![\w.]){re.escape(path.name)}\b|``{path.stem}``|(?<!`)`{path.stem}`", doc):
                missing.append(path.name)
    return missing


def package_dirs(root=ROOT):
    return [path.parent for package in PACKAGES for path in sorted((root / package).rglob("__init__.py"))
            if "__pycache__" not in path.parts]


@pytest.mark.parametrize("folder", package_dirs(), ids=lambda folder: str(folder.relative_to(ROOT)))
def test_every_package_map_names_each_of_its_modules(folder):
    exempt = readme_papers() if folder == ROOT / "algorithms" else ()
    missing = unnamed(folder, exempt)
    assert not missing, f"{folder.relative_to(ROOT)}/__init__.py's map does not name {missing}"


def test_a_module_missing_from_a_map_is_seen(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text('"""The map.\n\n    ring.py   the ring\n    ``tree``  the tree\n"""\n')
    for name in ("ring.py", "tree.py", "ringed.py"):
        (package / name).write_text("")
    (package / "room").mkdir()
    (package / "room" / "__init__.py").write_text("")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert unnamed(package) == ["ringed.py", "room/"]
        (package / "__main__.py").write_text("")
        assert unnamed(package) == ["__main__.py (python -m pkg)", "ringed.py", "room/"]
    finally:
        ROOT = saved


def algorithms_rank(module, papers):
    """core 0, shards 1, ps 2, sandblaster 3, a paper 4, a command over several papers 5 (None: the package)."""
    parts = module.split(".")[1:]
    if not parts:
        return None
    rooms = {"core": 0, "shards": 1, "ps": 2, "sandblaster": 3, "memory": 5}
    if parts[0] in rooms:
        return rooms[parts[0]]
    return 4 if parts[0] in papers else 5


def arrows_back_up(graph, papers):
    return [f"{source} ({algorithms_rank(source, papers)}) imports {target} ({algorithms_rank(target, papers)})"
            for source, targets in graph.items() if source.startswith("algorithms.")
            for target in targets if target.startswith("algorithms.")
            and algorithms_rank(target, papers) > algorithms_rank(source, papers)]


def test_no_arrow_runs_back_up_inside_algorithms():
    graph, _ = import_graph()
    papers = readme_papers()
    assert {"allreduce_sgd", "downpour_sgd", "zero"} <= papers
    found = arrows_back_up(graph, papers)
    assert not found, "imports against the rooms' order:\n  " + "\n  ".join(found)


def test_an_arrow_back_up_is_seen():
    graph = {"algorithms.core.run": {"algorithms.core.cli": 1, "algorithms.allreduce_sgd": 2},
             "algorithms.allreduce_sgd": {"algorithms.core.run": 1}, "algorithms.ps.job": {"algorithms.compare": 3}}
    assert arrows_back_up(graph, {"allreduce_sgd"}) == ["algorithms.core.run (0) imports algorithms.allreduce_sgd (4)",
                                                        "algorithms.ps.job (2) imports algorithms.compare (5)"]


def test_the_shards_room_stands_on_core_alone():
    papers = {"zero", "spatial_parallel"}
    graph = {"algorithms.shards.units": {"algorithms.core.cli": 1, "algorithms.zero": 2},
             "algorithms.shards.tiling": {"algorithms.ps.job": 1},
             "algorithms.core.run": {"algorithms.shards.regions": 1},
             "algorithms.zero": {"algorithms.shards.units": 1},
             "algorithms.memory.measured": {"algorithms.shards.tiling": 1, "algorithms.spatial_parallel": 2}}
    assert arrows_back_up(graph, papers) == ["algorithms.shards.units (1) imports algorithms.zero (4)",
                                             "algorithms.shards.tiling (1) imports algorithms.ps.job (2)",
                                             "algorithms.core.run (0) imports algorithms.shards.regions (1)"]


TOOL_ROOMS = ("bench", "sim", "cluster", "compression")
# a room's command under a name of its own (`python -m collectives.simulate`): a file that imports its room's
# command and nothing else may stand outside the room
COMMAND_NAMES = {"collectives.simulate": "collectives.sim.simulate"}


def reaching_into_rooms(graph):
    def room(module):
        parts = module.split(".")
        return parts[1] if len(parts) > 1 and parts[1] in TOOL_ROOMS else None
    return [f"{source} imports {target}" for source, targets in graph.items() if source.startswith("collectives")
            for target in targets if room(target) and room(source) != room(target)
            and not (COMMAND_NAMES.get(source) == target and list(targets) == [target])]


def test_nothing_outside_a_tool_room_of_collectives_imports_into_it():
    graph, _ = import_graph()
    assert any(module.startswith("collectives.bench.") for module in graph)
    found = reaching_into_rooms(graph)
    assert not found, "collectives' rooms are reached into:\n  " + "\n  ".join(found)
    assert not reaching_into_rooms({"collectives.ring": {"collectives.model.cost": 1}})
    assert reaching_into_rooms({"collectives.ring": {"collectives.bench.measure": 1}}) == [
        "collectives.ring imports collectives.bench.measure"]
    assert not reaching_into_rooms({"collectives.simulate": {"collectives.sim.simulate": 1}})
    more = {"collectives.simulate": {"collectives.sim.simulate": 1, "collectives.sim.engine": 2}}
    assert reaching_into_rooms(more) == ["collectives.simulate imports collectives.sim.simulate",
                                         "collectives.simulate imports collectives.sim.engine"]
