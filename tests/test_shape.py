"""The shape of the project, checked: fenced hearts, one-way imports, results kept across refactorings.

- Every heart a course may ask students to write is fenced ``# BEGIN SOLUTION`` / ``# END SOLUTION``
  (otter-grader / nbgrader syntax) inside exactly one function, with the docstring and signature
  outside the fence, and every algorithm module has one.
- ``minidl`` never imports MPI, ``collectives`` or ``algorithms``; ``collectives`` never imports
  ``minidl`` or ``algorithms``; ``algorithms`` imports ``collectives`` by name: no string import of
  any kind, and no module reaches collectives through another module (``run.collectives``).
- The README's main job, compared on the machine that runs it: twice the same bits, resumed after
  epoch 1 the bits of epoch 2, on 4 ranks serial SGD at 4 times the batch up to float32 rounding; and,
  on the machine kind where they were taken, the bits of the code before algorithms/ was reshaped
  around one training loop (keyed by the machine's fingerprint, tests/machine.py; a skip elsewhere).
- What the tests share is defined once: ``tiny_digits`` in tests/helpers.py, the fence parser in
  tutorials/assignments/ (a parser is any function that compares a line with a marker).
"""
import ast
import functools
import hashlib
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from tests import machine
from tests.helpers import parallel_assert_close, same_on_every_rank
from tutorials import assignments

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = assignments.BEGIN, assignments.END
MARKERS = (BEGIN, END)


def python_files(package):
    return sorted((ROOT / package).rglob("*.py"))


@functools.lru_cache(maxsize=None)
def parsed_source(text):
    """``ast.parse(text)``, once per distinct text: the checks below read the same few hundred files many times."""
    return ast.parse(text)


def parsed(path):
    return parsed_source(path.read_text())


def fenced_lines(path):
    """[(begin line, end line)] of the fenced regions of ``path`` (1-based), by the assignment tool's parser."""
    try:
        return [(begin + 1, end + 1) for begin, end in assignments.fences(path.read_text())]
    except ValueError as error:
        raise AssertionError(f"{path.name}: {error}") from None


def enclosing_functions(tree, lines, first, last):
    """The functions whose bodies contain lines first..last, innermost last. A trailing comment
    (the END marker after the function's last statement) belongs to the function if only blank
    and comment lines lie between them."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            tail = lines[node.end_lineno:last]
            only_comments = all(not line.strip() or line.strip().startswith("#") for line in tail)
            indented = len(lines[last - 1]) - len(lines[last - 1].lstrip()) > node.col_offset
            if node.body[0].lineno <= first <= node.end_lineno and only_comments and indented:
                found.append(node)
    return sorted(found, key=lambda node: node.lineno)


FENCED = [path for package in ("algorithms", "collectives", "minidl") for path in python_files(package)
          if fenced_lines(path)]


def test_fence_parser_rejects_broken_fences(tmp_path):
    broken = tmp_path / "broken.py"
    for text, complaint in [(f"def f():\n    {BEGIN}\n    return 1\n", "line 2: # BEGIN SOLUTION never ends"),
                            (f"def f():\n    {END}\n", "line 2: # END SOLUTION without a # BEGIN SOLUTION"),
                            (f"def f():\n    {BEGIN}\n    {BEGIN}\n", "line 3: # BEGIN SOLUTION inside another fence"),
                            (f"def f():\n    {BEGIN}  # mine\n    return 1\n    {END}\n",
                             "line 2: a fence marker must stand alone on its line")]:
        broken.write_text(text)
        with pytest.raises(AssertionError, match=f"^broken.py: {re.escape(complaint)}$"):
            fenced_lines(broken)


@pytest.mark.parametrize("path", FENCED, ids=[str(path.relative_to(ROOT)) for path in FENCED])
def test_each_fenced_heart_sits_inside_one_function_below_its_docstring(path):
    text = path.read_text()
    tree, lines = parsed_source(text), text.splitlines()
    for begin, end in fenced_lines(path):
        functions = enclosing_functions(tree, lines, begin, end)
        assert functions, f"{path.name}:{begin}: the fence is not inside a function"
        function = functions[-1]
        body = function.body
        first_code = body[1] if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body[0]
        assert isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), \
            f"{path.name}:{function.lineno}: {function.name} needs a docstring outside the fence"
        assert begin > body[0].end_lineno and first_code.lineno <= end, f"{path.name}:{begin}: fence placement"
        nested = [node for node in ast.walk(function) if node is not function
                  and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and begin <= node.lineno <= end]
        assert not nested, f"{path.name}:{begin}: a fence must not hold a whole nested definition"


ALGORITHM_MODULES = [path for path in python_files("algorithms")           # a module-level train(), not a method
                     if re.search(r"^def train\(", path.read_text(), re.M)]


@pytest.mark.parametrize("path", ALGORITHM_MODULES, ids=[path.stem for path in ALGORITHM_MODULES])
def test_every_algorithm_module_fences_its_heart(path):
    assert fenced_lines(path), f"{path.name} has no # BEGIN SOLUTION / # END SOLUTION heart"


STRING_IMPORTERS = {"importlib", "runpy", "pkgutil"}       # modules whose only job here would be importing by string


def imported_packages(path):
    """The top-level packages ``path`` imports by name, and "<string import>" if it imports anything by
    a string: ``importlib`` / ``runpy`` / ``pkgutil`` used at all, ``__import__(...)``, ``sys.modules[...]``."""
    tree = parsed(path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
            names.add("<string import>")
        elif isinstance(node, ast.Attribute) and node.attr in ("modules", "__import__", "import_module") \
                and not (node.attr == "modules" and not (isinstance(node.value, ast.Name) and node.value.id == "sys")):
            names.add("<string import>")
    if names & STRING_IMPORTERS:
        names.add("<string import>")
    return names


@pytest.mark.parametrize("package, forbidden", [("minidl", {"mpi4py", "collectives", "algorithms"}),
                                                ("collectives", {"minidl", "algorithms"}),
                                                ("algorithms", {"<string import>"})])
def test_packages_import_only_downwards(package, forbidden):
    bad = {str(path.relative_to(ROOT)): sorted(imported_packages(path) & forbidden)
           for path in python_files(package) if imported_packages(path) & forbidden}
    assert not bad, f"imports against the one-way arrows of the design: {bad}"


@pytest.mark.parametrize("source, string_import", [
    ("import importlib\nring = importlib.import_module('collectives.ring')\n", True),
    ("from importlib import import_module\nring = import_module(f'collectives.{name}')\n", True),
    ("ring = __import__('collectives.ring')\n", True),
    ("import sys\nring = sys.modules['collectives.ring']\n", True),
    ("import runpy\nrunpy.run_module('collectives.ring')\n", True),
    ("import collectives\nfrom collectives import ring\ncollectives.allreduce(comm, data, algorithm='ring')\n", False),
])
def test_every_kind_of_string_import_is_seen(tmp_path, source, string_import):
    path = tmp_path / "module.py"
    path.write_text(source)
    assert ("<string import>" in imported_packages(path)) == string_import, source


def collectives_reached_otherwise(path):
    """Where ``path`` reaches collectives without importing the package itself: the name ``collectives``
    used but never bound by ``import collectives``, taken from another module (``from x import
    collectives``), or reached through one (``run.collectives``)."""
    tree = parsed(path)
    imports_it = any(isinstance(node, ast.Import) and any(alias.name.split(".")[0] == "collectives"
                                                          and alias.asname is None for alias in node.names)
                     for node in ast.walk(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == "collectives" and not imports_it:
            found.append(f"line {node.lineno}: collectives used, never imported")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] != "collectives" \
                and any(alias.name == "collectives" for alias in node.names):
            found.append(f"line {node.lineno}: collectives taken from {node.module}")
        elif isinstance(node, ast.Attribute) and node.attr == "collectives":
            found.append(f"line {node.lineno}: collectives reached through {ast.unparse(node.value)}")
    return found


def algorithm_modules_imported(path):
    """The modules of algorithms/ that ``path`` imports, named from algorithms/ ("model_parallel",
    "core.run"): ``from algorithms import x``, ``from algorithms.x import y``, ``import algorithms.x``."""
    names = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        names.update(module.removeprefix("algorithms.") for module in modules if module.startswith("algorithms."))
    return names


def test_the_machinery_imports_no_runnable_algorithm_module():
    """core/ and ps/ sit below the papers at the top of algorithms/: what two algorithms share moves
    down into them, never the other way. The comparison driver (``compare.py``, beside the papers) runs
    algorithms as commands, and nothing in algorithms/ imports it."""
    runnable = {path.stem for path in (ROOT / "algorithms").glob("*.py")
                if re.search(r"^def main\(", path.read_text(), re.M)}
    machinery = [path for room in ("core", "ps") for path in python_files(f"algorithms/{room}")]
    assert runnable and machinery
    upward = {str(path.relative_to(ROOT)): sorted(algorithm_modules_imported(path) & runnable)
              for path in machinery if algorithm_modules_imported(path) & runnable}
    assert not upward, f"machinery importing runnable algorithm modules: {upward}"
    importers = [str(path.relative_to(ROOT)) for path in python_files("algorithms")
                 if "compare" in algorithm_modules_imported(path)]
    assert not importers, f"algorithms/ importing the comparison driver: {importers}"


def test_algorithms_import_collectives_by_name():
    users = [path.name for path in python_files("algorithms") if "collectives" in imported_packages(path)]
    assert users, "no module of algorithms/ imports collectives"
    bad = {str(path.relative_to(ROOT)): collectives_reached_otherwise(path) for path in python_files("algorithms")
           if collectives_reached_otherwise(path)}
    assert not bad, f"modules that use collectives without importing it by name: {bad}"


def test_a_module_that_reaches_collectives_through_another_is_seen(tmp_path):
    path = tmp_path / "module.py"
    for source in ("from algorithms import run\nrun.collectives.allreduce(comm, data)\n",
                   "from algorithms.run import collectives\ncollectives.allreduce(comm, data)\n",
                   "collectives.allreduce(comm, data)\n"):
        path.write_text(source)
        assert collectives_reached_otherwise(path), source
    path.write_text("import collectives\nfrom collectives.trace import CountingComm\n"
                    "collectives.allreduce(comm, data)\n")
    assert not collectives_reached_otherwise(path)


# ---- the README's main job, compared on the machine that runs it ---------------------------------------
# Bits are compared only with bits computed on the same machine: another CPU, BLAS kernel or cache size
# rounds the same arithmetic otherwise, and is as right. Each claim below would catch what a digest
# pinned on one machine caught there, everywhere. Beside them, elsewhere: serial SGD run twice and
# resumed (tests/test_serial_sgd.py), every algorithm's resume on 3 ranks (tests/test_checkpoints.py),
# p ranks x b = serial p b in float64 for every allreduce (tests/test_sync_sgd.py), the convolution
# kernels against each other and the direct loop (tests/test_conv_algorithms.py, test_conv_layouts.py).
README_JOB = dict(epochs=2, quiet=True)            # `mpiexec -n 4 python -m algorithms.allreduce_sgd`, 2 epochs
# p ranks at batch b against serial SGD at batch p b, both float32: the same gradient summed in another
# order (each rank's mean first, then the ring's sum of the weighted means), so the parameters differ by
# float32 rounding carried through the steps: measured 1.2e-7 to 1.5e-7 after 2 epochs (max |difference|
# over max |parameter|: about one float32 step, 2^-23, of the largest parameter) with three OpenBLAS
# kernels (SkylakeX, Haswell, Nehalem) and with no columns kept. The tolerance leaves a factor of about
# 70 for other kernels and CPUs; each rank's gradient weighted 1/p instead of by its rows (wrong in the
# epoch's last, uneven batch only) is off by 2.7e-3.
FLOAT32_STEPS = 1e-5


def shared_folder(comm):
    """One temporary folder every rank sees (rank 0 makes it and names it)."""
    return Path(comm.bcast(tempfile.mkdtemp(prefix="minidl-shape-") if comm.rank == 0 else None, root=0))


def logged(history):
    """A run's per-epoch numbers: losses and accuracy (not its wall time, nor its bytes, which a resumed
    run counts from its own start)."""
    return [{key: record[key] for key in ("epoch", "train_loss", "test_loss", "test_accuracy")} for record in history]


@functools.lru_cache(maxsize=None)
def readme_main_job(nprocs):
    """The README's main job for 2 epochs on the world's ranks, once per process: (params, history).
    Every rank calls it at the same test, in file order, so the collective run is one."""
    from algorithms import allreduce_sgd
    assert MPI.COMM_WORLD.size == nprocs
    return allreduce_sgd.train(MPI.COMM_WORLD, **README_JOB)


@pytest.mark.parallel(nprocs=[4])
def test_the_readme_main_job_run_twice_gives_the_same_bits_on_every_rank():
    from algorithms import allreduce_sgd
    comm = MPI.COMM_WORLD
    first, history = readme_main_job(comm.size)
    again, history_again = allreduce_sgd.train(comm, **README_JOB)
    parallel_assert(np.array_equal(first, again), "two runs of the same command differ in their parameters")
    parallel_assert(logged(history) == logged(history_again), "two runs of the same command logged different numbers")
    parallel_assert(same_on_every_rank(comm, first), "the replicas differ across ranks")


@pytest.mark.parallel(nprocs=[4])
def test_the_readme_main_job_resumed_from_its_epoch_1_checkpoint_gives_epoch_2s_bits():
    """1 epoch, --save, then --resume for the second: the parameters of the unbroken 2-epoch run, bit
    for bit (the momentum buffer travels in the file; a resume without it differs from the first step on)."""
    from algorithms import allreduce_sgd
    comm = MPI.COMM_WORLD
    straight, history = readme_main_job(comm.size)
    folder = shared_folder(comm)
    checkpoint = str(folder / "epoch1.npz")
    allreduce_sgd.train(comm, **dict(README_JOB, epochs=1), save=checkpoint)
    resumed, resumed_history = allreduce_sgd.train(comm, **README_JOB, resume=checkpoint)
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(folder)
    parallel_assert(np.array_equal(resumed, straight),
                    f"epoch 2 after --resume differs from the unbroken run by {np.max(np.abs(resumed - straight)):.3g}")
    parallel_assert(logged(resumed_history) == logged(history[1:]),
                    f"the resumed run logged {logged(resumed_history)}, the unbroken one {logged(history[1:])}")


@pytest.mark.parallel(nprocs=[4])
def test_the_readme_main_job_on_4_ranks_at_batch_32_is_serial_sgd_at_batch_128_up_to_float32_rounding():
    from algorithms import serial_sgd
    comm = MPI.COMM_WORLD
    params, _ = readme_main_job(comm.size)
    serial = None
    if comm.rank == 0:                             # one serial run, not one per rank on shared cores
        serial, _ = serial_sgd.train(**README_JOB, batch_size=32 * comm.size)
    serial = comm.bcast(serial, root=0)
    parallel_assert_close(params, serial, FLOAT32_STEPS, f"p = {comm.size} at batch 32 against serial batch "
                                                         f"{32 * comm.size}")


# ---- results pinned across refactorings, where they were pinned ----------------------------------------
# A regression guard on top of the claims above: sha256 of the final float32 parameters of two short
# runs, taken with the code before algorithms/ was reshaped around one training loop (and again, on
# purpose, when conv2d's bias gradient began summing the images first: the same sum in another order).
# A refactoring that changes one bit of the arithmetic order changes them. They hold only where they were
# taken: keyed by what decides the bits (tests/machine.py: the BLAS kernel by OpenBLAS's own name, the L2
# the convolution's blocks follow, the column budget, NumPy, the architecture); anywhere else the test
# skips, naming this machine's fingerprint. Two kernels of one CPU (OPENBLAS_CORETYPE unset, and Haswell
# forced) each have their pair.
PINNED = {
    "SkylakeX, L2 1 MiB, columns 64 MiB, NumPy 2.4.6, x86_64": {
        "serial_sgd --epochs 2": "adf3ae10186d1812141e819bf493e7ce0081fd0cad0a40ba4832f4a6527e7450",
        "mpiexec -n 4 allreduce_sgd --epochs 2": "938dece1b67c8b166790c3eb6ae346264cea8b98255352999c699d3a73ee6367"},
    "Haswell, L2 1 MiB, columns 64 MiB, NumPy 2.4.6, x86_64": {
        "serial_sgd --epochs 2": "73e840487607e9aa86580da56a3ab585315bee9e902637dd23ea0e64d735013b",
        "mpiexec -n 4 allreduce_sgd --epochs 2": "5c1a887fdb760707e4059fc9a96bef1f3715f964a95fd9b71187c30a22ef6e16"},
}


def pinned(run):
    """The digest of ``run`` pinned for this machine's fingerprint (a skip, naming it, if none is)."""
    here = machine.fingerprint()
    if here not in PINNED:
        pytest.skip(f"no digest pinned for this machine ({here}); its bits are compared with its own runs "
                    f"(twice, resume, p x b) instead")
    return PINNED[here][run]


def digest(params):
    return hashlib.sha256(np.ascontiguousarray(params, dtype=np.float32).tobytes()).hexdigest()


def test_serial_sgd_gives_the_bits_pinned_for_this_machine():
    from algorithms import serial_sgd
    expected = pinned("serial_sgd --epochs 2")
    params, _ = serial_sgd.train(**README_JOB)
    assert digest(params) == expected, f"serial SGD's parameters changed bits on {machine.fingerprint()}"


@pytest.mark.parallel(nprocs=[4])
def test_the_readme_main_job_gives_the_bits_pinned_for_this_machine():
    expected = pinned("mpiexec -n 4 allreduce_sgd --epochs 2")
    params, _ = readme_main_job(MPI.COMM_WORLD.size)
    parallel_assert(digest(params) == expected,
                    f"allreduce SGD's parameters changed bits on {machine.fingerprint()}")


# ---- the project speaks of itself -----------------------------------------------------------------
HOW_IT_WAS_MADE = re.compile(r"\bissue[- ]?\d+|\bthe issue('s)?\b|\bissue's owner\b|\bstop \d+\b", re.I)


def test_code_tests_and_chapters_name_targets_by_what_they_are_not_by_where_they_came_from():
    """No tracker numbers or "the issue" in the project: a reader of it has never seen the tracker."""
    files = [path for folder in ("minidl", "collectives", "algorithms", "tutorials", "tests")
             for pattern in ("*.py", "*.md") for path in (ROOT / folder).rglob(pattern)]
    files = [path for path in files + [ROOT / "README.md"] if path.name != "test_shape.py"]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in files
             for number, line in enumerate(path.read_text().splitlines(), 1) if HOW_IT_WAS_MADE.search(line)]
    assert not found, "\n".join(found[:20])


# ---- what the tests share is defined once -----------------------------------------------------------

def repository_python_files():
    return sorted(path for folder in ("minidl", "collectives", "algorithms", "tutorials", "tests")
                  for path in (ROOT / folder).rglob("*.py"))


@functools.lru_cache(maxsize=None)
def definitions(text):
    """{name: line numbers where ``text`` defines it} (a def, a class or an assignment to the name)."""
    found = {}
    for node in ast.walk(parsed_source(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.lineno)
    return found


def definitions_of(name, path):
    """Line numbers where ``path`` defines ``name`` (a def, a class or an assignment to the name), in the
    order ``ast.walk`` meets them."""
    return list(definitions(path.read_text()).get(name, []))


def is_a_marker(node):
    """``node`` stands for a fence marker: the string itself, or a name (or attribute) BEGIN / END."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.strip() in MARKERS
    return (isinstance(node, ast.Name) and node.id in ("BEGIN", "END")) or \
        (isinstance(node, ast.Attribute) and node.attr in ("BEGIN", "END"))


def compares_with_a_marker(node):
    """True if ``node`` compares a line with a fence marker (``== BEGIN``, ``.startswith(END)``,
    ``in (BEGIN, END)``)."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        sides += [item for side in sides if isinstance(side, (ast.Tuple, ast.List, ast.Set)) for item in side.elts]
        return any(is_a_marker(side) for side in sides)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("startswith", "endswith") and node.args:
        argument = node.args[0]
        items = argument.elts if isinstance(argument, (ast.Tuple, ast.List)) else [argument]
        return any(is_a_marker(item) for item in items)
    return False


def parses_fences(function):
    """True if ``function`` compares a line with a fence marker: it is a fence parser, whatever its name."""
    return any(compares_with_a_marker(node) for node in ast.walk(function))


def fence_parsers(path):
    """The functions of ``path`` that parse fences (``parses_fences``), found in one walk of the file: a
    comparison with a marker makes every function around it one."""
    found = {}

    def visit(node, around):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            around = (*around, node)
        if around and compares_with_a_marker(node):
            found.update((function.lineno, function) for function in around)
        for child in ast.iter_child_nodes(node):
            visit(child, around)
    visit(parsed(path), ())
    return [f"{path.relative_to(ROOT)}:{line} {function.name}" for line, function in sorted(found.items())]


def test_tiny_digits_and_the_fence_parser_are_each_defined_once():
    files = repository_python_files()
    tiny = [(str(path.relative_to(ROOT)), line) for path in files for line in definitions_of("tiny_digits", path)]
    assert [path for path, _ in tiny] == ["tests/helpers.py"], \
        f"tiny_digits is defined more than once, or not in tests/helpers.py: {tiny}"
    parsers = [found for path in files for found in fence_parsers(path)]
    assert [(found.split(":")[0], found.split(" ")[1]) for found in parsers] == \
        [("tutorials/assignments/__init__.py", "fences")], f"fence parsers: {parsers} (the one: assignments.fences)"


def test_a_second_fence_parser_is_seen_whatever_its_name():
    copies = ["def markers(text):\n    return [i for i, line in enumerate(text.splitlines())\n"
              "            if line.strip() == BEGIN]\n",
              "def markers(text):\n    return [line for line in text.splitlines() if '# END SOLUTION' in "
              "(line.strip(),)]\n",
              "def markers(lines):\n    return [line for line in lines\n"
              "            if line.lstrip().startswith(('# BEGIN SOLUTION', 'x'))]\n",
              "def markers(lines):\n    return [line for line in lines if line.strip() == assignments.END]\n"]
    for copy in copies:
        assert parses_fences(ast.parse(copy).body[0]), copy
    assert not parses_fences(ast.parse("def stub(task):\n    return f'{BEGIN} {task}'\n").body[0])


def test_the_agreed_set_up_is_written_once():
    """Every algorithm starts through ``run.agreed`` (``run.start`` and the parameter-server job's
    ``start`` use it too): nobody else catches the set-up's errors and calls ``agree_on_errors``
    by hand, the pattern that was written out seven times."""
    callers = [f"{path.relative_to(ROOT)}:{number}" for path in python_files("algorithms")
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if "agree_on_errors(" in line and "def agree_on_errors" not in line]
    assert callers == ["algorithms/core/run.py:" + str(next(
        number for number, line in enumerate((ROOT / "algorithms/core/run.py").read_text().splitlines(), 1)
        if line.strip() == "agree_on_errors(comm, error)"))], f"agree_on_errors called outside run.agreed: {callers}"
    users = {path.relative_to(ROOT).as_posix() for path in python_files("algorithms")
             if re.search(r"\bagreed\(", path.read_text())}
    assert {"algorithms/pbt.py", "algorithms/hogwild.py", "algorithms/sandblaster_lbfgs.py",
            "algorithms/ps/job.py"} <= users, users


ONCE = {"play": "algorithms/ps/loop.py", "collect": "algorithms/ps/loop.py",
        "JobFailed": "algorithms/ps/loop.py", "check_divergence": "algorithms/core/divergence.py",
        "nonfinite": "algorithms/core/divergence.py", "loss_became": "algorithms/core/divergence.py",
        "Diverged": "algorithms/core/divergence.py", "FiniteCheck": "algorithms/core/divergence.py"}


def test_the_asynchronous_job_loop_and_the_divergence_check_are_each_defined_once():
    """The parameter-server family and Sandblaster end their jobs through one loop (``ps.loop``: a
    role's escaping exception aborts the job, one allgather raises the same error everywhere or joins
    the shards, one --save); a loss that is not finite or grew a hundredfold is tested and worded in
    ``core.divergence`` alone. A second definition of any of these names, a second gather of the
    roles' parts, or a second hand-written abort or "loss became" message fails here."""
    files = python_files("algorithms")
    for name, home in ONCE.items():
        found = [path.relative_to(ROOT).as_posix() for path in files for _ in definitions_of(name, path)]
        assert found == [home], f"{name} is defined at {found}, once in {home} expected"
    for path in files:
        where, text = path.relative_to(ROOT).as_posix(), path.read_text()
        if where != "algorithms/ps/loop.py":
            assert "allgather(mine)" not in text, f"{where} gathers the roles' parts itself: use ps.loop.collect"
            assert "abort_job(" not in text or where == "algorithms/core/cli.py", \
                f"{where} aborts a job itself: a role runs through ps.loop.play"
        if where != "algorithms/core/divergence.py":
            assert "loss became" not in text, f"{where} words a non-finite loss itself: divergence.loss_became"
    users = {path.relative_to(ROOT).as_posix() for path in files if "loop.play(" in path.read_text()}
    assert users == {"algorithms/ps/job.py", "algorithms/sandblaster_lbfgs.py"}, users
