"""Course assignments: the fenced hearts become student tasks, the tests become the grader.

    python -m tutorials.assignments list                                 # the tasks
    python -m tutorials.assignments make --out DIR [--tasks 3.4,3.6]     # a student tree
    python -m tutorials.assignments make --out DIR --solutions           # an instructor tree
    python -m tutorials.assignments syllabus                             # the syllabus and rubric tables
    python -m tutorials.block 03 2                                       # one block of chapter 3
    python tests/grade.py [--student DIR] [--tasks ...] [--json FILE]    # grade (see tests/grade.py)

The registry (``tasks.toml`` beside this file) names each task's file and function. In the
source, that function's body holds one fence, as otter-grader and nbgrader write it::

    def ring_reduce_scatter_in_place(comm, data, op):
        \"\"\"docstring, signature and argument checks stay\"\"\"
        # BEGIN SOLUTION
        ... the heart ...
        # END SOLUTION

``make`` replaces what lies between the markers by ``raise NotImplementedError("Task 3.4: ...")``
(the markers stay, so a student writes between them and the grader can take their code back out),
and leaves out hidden tests and solution-only files (``[generator] remove``).
"""
import ast
import dataclasses
import functools
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:                                                   # pragma: no cover - Python 3.10
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REGISTRY = HERE / "tasks.toml"
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
STUB = "raise NotImplementedError("


@dataclasses.dataclass(frozen=True)
class Task:
    id: str
    title: str
    file: str
    function: str
    chapter: int
    section: str
    points: float
    hours: float
    difficulty: str
    requires: tuple
    forbid: tuple = ()          # MPI methods the body may not call (it builds them from point-to-point)
    forward: tuple = ()         # "module.qualname" of functions whose whole call the grader forwards too
    returns: tuple = ()         # "module:qualname" of the namedtuples and dataclasses its calls may return
    in_place: bool = True       # whether its function may change what it is given (false: it returns its result)

    def stub_line(self):
        """The line that replaces the body: it says which task and where the chapter explains it."""
        return f'{STUB}"Task {self.id}: {self.title} - see {self.section}")'


def load(path=REGISTRY):
    """(tasks ordered by id: chapter, then number; the [generator] table)."""
    with open(path, "rb") as file:
        registry = tomllib.load(file)
    known = {field.name for field in dataclasses.fields(Task)}
    for entry in registry["task"]:
        unknown = sorted(set(entry) - known)
        if unknown:                               # e.g. a `sandbox = false`: every task is sandboxed, no switch
            raise ValueError(f"{path}: task {entry.get('id', '?')} has unknown key(s) {unknown}")
    tasks = [Task(**{**entry, "requires": tuple(entry.get("requires", ())), "forbid": tuple(entry.get("forbid", ())),
                     "forward": tuple(entry.get("forward", ())), "returns": tuple(entry.get("returns", ()))})
             for entry in registry["task"]]
    tasks.sort(key=lambda task: tuple(int(part) for part in task.id.split(".")))
    ids = [task.id for task in tasks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate task ids")
    for task in tasks:
        unknown = [needed for needed in task.requires if needed not in ids]
        if unknown:
            raise ValueError(f"{path}: task {task.id} requires unknown task(s) {unknown}")
    return tasks, registry.get("generator", {})


def select(tasks, ids):
    """The tasks named in ``ids`` (a comma-separated string or a list; None: all)."""
    if ids is None:
        return list(tasks)
    wanted = [part.strip() for part in (ids.split(",") if isinstance(ids, str) else ids) if part.strip()]
    known = {task.id: task for task in tasks}
    unknown = [task_id for task_id in wanted if task_id not in known]
    if unknown:
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; see python -m tutorials.assignments list")
    return [known[task_id] for task_id in wanted]


def weeks(path=REGISTRY):
    """The [[week]] tables of the registry, ordered by week: dicts with week, chapter, tasks, papers."""
    with open(path, "rb") as file:
        return sorted(tomllib.load(file).get("week", []), key=lambda week: week["week"])


def chapter_title(chapter, root=ROOT):
    """'autograd and layers' for 1: the chapter's first heading after 'Chapter N:'."""
    path = next((Path(root) / "tutorials").glob(f"{chapter:02d}_*.md"))
    return path.read_text().splitlines()[0].split(":", 1)[1].strip(), path.name


def syllabus(root=ROOT):
    """The syllabus and rubric tables (markdown) of tutorials/assignments/syllabus.md, from the registry."""
    tasks, _ = load()
    by_id = {task.id: task for task in tasks}
    lines = ["| week | chapter | papers | tasks | points | hours |", "| --- | --- | --- | --- | --- | --- |"]
    for week in weeks():
        chosen = [by_id[task_id] for task_id in week["tasks"]]
        title, name = chapter_title(week["chapter"], root)
        lines.append(f"| {week['week']} | [{week['chapter']}. {title}](../{name}) | {week['papers']} | "
                     f"{', '.join(task.id for task in chosen)} | {sum(task.points for task in chosen):g} | "
                     f"{sum(task.hours for task in chosen):g} |")
    lines.append(f"| | | | {len(tasks)} tasks | {sum(task.points for task in tasks):g} | "
                 f"{sum(task.hours for task in tasks):g} |")
    lines += ["", "| task | title | points | hours | difficulty | do first |", "| --- | --- | --- | --- | --- | --- |"]
    for task in tasks:
        lines.append(f"| {task.id} | {task.title} | {task.points:g} | {task.hours:g} | {task.difficulty} | "
                     f"{', '.join(task.requires) or '-'} |")
    return "\n".join(lines) + "\n"


# ---- fences -----------------------------------------------------------------------------------------

def fences(text):
    """[(begin, end)] 0-based line numbers of the markers in ``text``, checked to pair up and to stand
    alone on their lines. The one fence parser: the generator, the grader and tests/test_shape.py use it."""
    pairs, begin = [], None
    for number, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if stripped == BEGIN:
            if begin is not None:
                raise ValueError(f"line {number + 1}: {BEGIN} inside another fence")
            begin = number
        elif stripped == END:
            if begin is None:
                raise ValueError(f"line {number + 1}: {END} without a {BEGIN}")
            pairs.append((begin, number))
            begin = None
        elif stripped.startswith((BEGIN, END)):
            raise ValueError(f"line {number + 1}: a fence marker must stand alone on its line")
    if begin is not None:
        raise ValueError(f"line {begin + 1}: {BEGIN} never ends")
    return pairs


def qualified_functions(tree):
    """{qualified name ('f', 'Class.method', 'outer.inner'): FunctionDef} of a module's functions."""
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found[name] = child
                visit(child, name + ".")
            else:
                visit(child, prefix)
    visit(tree, "")
    return found


def owner(functions, begin):
    """The qualified name of the innermost function whose body holds line ``begin`` (0-based)."""
    best = None
    for name, node in functions.items():
        if node.lineno < begin + 1 <= node.end_lineno:
            if best is None or node.lineno > functions[best].lineno:
                best = name
    return best


@functools.lru_cache(maxsize=512)
def fenced_functions(text):
    """{qualified function name: (begin, end)} of every fence in a module's source (cached: pure in ``text``;
    the caller must not change the dict)."""
    functions = qualified_functions(ast.parse(text))
    out = {}
    for begin, end in fences(text):
        name = owner(functions, begin)
        if name is None:
            raise ValueError(f"line {begin + 1}: a fence outside any function")
        if name in out:
            raise ValueError(f"{name} has two fences")
        out[name] = (begin, end)
    return out


def fence_of(task, root=ROOT):
    """(lines of the task's file, begin, end) in the tree at ``root``."""
    path = Path(root) / task.file
    text = path.read_text()
    where = fenced_functions(text).get(task.function)
    if where is None:
        raise ValueError(f"task {task.id}: no fence in {task.function} of {path}")
    return text.splitlines(keepends=True), where[0], where[1]


def body(task, root=ROOT):
    """The lines between the task's markers in the tree at ``root``."""
    lines, begin, end = fence_of(task, root)
    return lines[begin + 1:end]


# Names that reach an attribute or a module spelled at run time: in a file whose task forbids MPI calls, any
# of them would let a body call one without writing its name, so the file is not graded.
DYNAMIC = {"getattr": "getattr() with a name computed at run time", "eval": "eval()", "exec": "exec()",
           "__builtins__": "__builtins__", "getattr_static": "inspect.getattr_static()",
           "compile": "compile()", "__import__": "__import__()", "vars": "vars()", "globals": "globals()",
           "locals": "locals()", "attrgetter": "operator.attrgetter()", "methodcaller": "operator.methodcaller()",
           "__getattribute__": "__getattribute__", "__dict__": "__dict__", "import_module": "importlib"}
NOT_MPI = ("np", "numpy", "xp", "functools", "itertools", "math", "operator")   # np.add.reduce is no MPI call


def _root_name(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.value if not isinstance(node, ast.Call) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _written(text, reference):
    """The 1-based numbers of the lines of ``text`` that are not the reference's own (what the student wrote)."""
    import difflib
    mine, theirs = text.splitlines(), reference.splitlines()
    kept = set()
    for block in difflib.SequenceMatcher(None, mine, theirs, autojunk=False).get_matching_blocks():
        kept.update(range(block.a + 1, block.a + block.size + 1))
    return set(range(1, len(mine) + 1)) - kept


def forbidden_calls(task, root=ROOT, text=None, reference=ROOT):
    """Why a submitted file may not be graded ("" if it may): the file of a task with ``forbid``
    reaches one of those MPI methods (``comm.Allreduce`` in a ring task scores nothing, whatever its
    tests say). Read from the whole file's source, never run: an attribute of that name anywhere
    (``comm.Allreduce``, ``f = comm.Allreduce``, ``type(comm).Allreduce``; not ``np.add.reduce``),
    ``getattr(comm, "Allreduce")``, or a way to name one at run time
    (``getattr`` with a computed name, ``eval``, ``vars``, ``__dict__``, ``importlib``, ...). The
    grader's network refuses those MPI calls from the sandbox too (tests/grade_proxy.py), however
    they were reached; this check says so before anything runs. A file that does not parse is
    graded (its tests then fail, saying why). Lines that are the reference's own, unchanged (a set-up
    helper of the file: the hierarchical allreduce's node size), are the grader's, not the student's."""
    if not task.forbid:
        return ""
    text = text if text is not None else (Path(root) / task.file).read_text()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ""
    written, used = _written(text, (Path(reference) / task.file).read_text()), set()
    for node in ast.walk(tree):
        if not set(range(getattr(node, "lineno", 0), getattr(node, "end_lineno", -1) + 1)) & written:
            continue
        if isinstance(node, ast.Attribute):
            if node.attr in task.forbid and _root_name(node.value) not in NOT_MPI:
                used.add(node.attr)
            elif node.attr in DYNAMIC:
                used.add(DYNAMIC[node.attr])
        elif isinstance(node, ast.Name) and node.id in DYNAMIC and node.id != "getattr":
            used.add(DYNAMIC[node.id])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            names = [alias.name for alias in node.names]
            if any(module.split(".")[0] in ("importlib", "builtins", "inspect") for module in modules) \
                    or any(name in DYNAMIC for name in names):
                used.add("an import of importlib, builtins, inspect or operator's attrgetter")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                used.add(DYNAMIC["getattr"])
            elif name.value in task.forbid:
                used.add(name.value)
    if not used:
        return ""
    return (f"task {task.id}'s file {task.file} reaches {', '.join(sorted(used))}, and the task must build its "
            f"collective from point-to-point messages (Send, Recv, Sendrecv, Isend, Irecv); see {task.section}")


def stubbed(task_id, root=ROOT):
    """True when the task's body in the tree at ``root`` is still the generated stub."""
    tasks, _ = load()
    task = select(tasks, [task_id])[0]
    return [line.strip() for line in body(task, root) if line.strip()] == [task.stub_line()]


def replace_body(task, root, new_body):
    """Write ``new_body`` (lines) between the task's markers in the tree at ``root``."""
    lines, begin, end = fence_of(task, root)
    (Path(root) / task.file).write_text("".join(lines[:begin + 1] + list(new_body) + lines[end:]))


def stub(task, root):
    """Replace the task's body in the tree at ``root`` by its NotImplementedError line."""
    lines, begin, _ = fence_of(task, root)
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    replace_body(task, root, [indent + task.stub_line() + "\n"])


def stub_all(tasks, root):
    """``stub`` each of ``tasks`` in the tree at ``root``, reading and writing each file once."""
    for file in sorted({task.file for task in tasks}):
        path = Path(root) / file
        text = path.read_text()
        lines, fenced = text.splitlines(keepends=True), fenced_functions(text)
        for task in sorted((task for task in tasks if task.file == file), key=lambda task: -fenced[task.function][0]):
            begin, end = fenced[task.function]
            indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
            lines[begin + 1:end] = [indent + task.stub_line() + "\n"]
        path.write_text("".join(lines))


def is_student_tree(root=ROOT):
    """True in a generated student tree: it has none of the solution-only files ([generator] remove).
    The reference checkout and an instructor tree (``make --solutions``) have them."""
    _, generator = load()
    return not any((Path(root) / path).exists() for path in generator.get("remove", ()))


STUDENT_TREE = ("not the reference checkout: a generated student tree (make leaves out the hidden tests, "
                "the replay oracle and the worked answers)")


def is_git_checkout(root=ROOT):
    """True if ``root`` is a git work tree (``make`` lists the files to copy with git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=root, capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "true" and \
        Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=root, capture_output=True,
                            text=True, timeout=30).stdout.strip()).resolve() == Path(root).resolve()


# ---- trees --------------------------------------------------------------------------------------------

def tracked_files(root=ROOT):
    """The repository's files as git sees them (tracked, and untracked ones it does not ignore); in a
    tree that is no git checkout (an unpacked autograder), every file but caches and virtual envs."""
    if not (Path(root) / ".git").exists():
        skip = {".venv", "__pycache__", ".pytest_cache", ".hypothesis"}
        return sorted(str(path.relative_to(root)) for path in Path(root).rglob("*")
                      if path.is_file() and not skip & set(path.relative_to(root).parts))
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    return [name for name in listed if (Path(root) / name).is_file()]


def copy_tree(out, root=ROOT, leave_out=(), only=None):
    """Copy the repository's files (``only`` these, if given) to ``out`` (which must not exist or be
    empty), but ``leave_out``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not empty")
    skip = [Path(item) for item in leave_out]
    for name in (tracked_files(root) if only is None else only):
        path = Path(name)
        if any(path == item or item in path.parents for item in skip):
            continue
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(Path(root) / path, target)
    return out


ASSIGNMENT = "tutorials/assignments/assignment.toml"       # written into every student tree


def prerequisites(tasks, ids):
    """Every task that the tasks ``ids`` run through, directly or not (``requires``, transitively)."""
    by_id, found, todo = {task.id: task for task in tasks}, set(), list(ids)
    while todo:
        for needed in by_id[todo.pop()].requires:
            if needed not in found:
                found.add(needed)
                todo.append(needed)
    return found


def released(tasks, assigned, also=()):
    """The tasks whose reference code a student tree keeps: the prerequisites of the ``assigned``
    ones that are not assigned themselves, and ``also`` (an instructor's ``--released``). Every other
    task is a stub, so that the first homework does not hand out the answers to the next ones."""
    assigned, also = set(assigned), set(also)
    if assigned & also:
        raise ValueError(f"task(s) {', '.join(sorted(assigned & also))} both assigned and released")
    return (prerequisites(tasks, assigned) - assigned) | also


def assignment(root=ROOT):
    """(assigned ids, released ids) that ``make`` wrote into a student tree, or None elsewhere."""
    path = Path(root) / ASSIGNMENT
    if not path.exists():
        return None
    with open(path, "rb") as file:
        table = tomllib.load(file)
    return set(table.get("assigned", ())), set(table.get("released", ()))


def not_assigned(task_id, root=ROOT):
    """Why a test of ``task_id`` skips in the tree at ``root`` ("" if it runs): a student tree stubs the
    tasks it neither assigns nor releases, and their tests have nothing to test there."""
    written = assignment(root)
    if written is None or task_id in written[0] or task_id in written[1]:
        return ""
    return (f"task {task_id} is not part of this assignment: its body is a stub here and its reference code is "
            "not released (make --tasks / --released)")


def make(out, ids=None, solutions=False, root=ROOT, also_released=(), files=None):
    """Write a student tree (or, with ``solutions``, an instructor tree) to ``out``; returns the
    assigned tasks. Stubbed: every task but the assigned ones' prerequisites and ``also_released``
    (``released``); the assigned tasks and what they release are written to ``ASSIGNMENT``.
    ``files``: copy only these of the repository's files (a test's quick tree)."""
    tasks, generator = load()
    chosen = select(tasks, ids)
    extra = select(tasks, also_released) if also_released else []
    keep = released(tasks, [task.id for task in chosen], [task.id for task in extra])
    copy_tree(out, root, leave_out=() if solutions else generator.get("remove", ()), only=files)
    if not solutions:
        stub_all([task for task in tasks if task.id not in keep and (files is None or task.file in files)], out)
        listed = ", ".join(f'"{task.id}"' for task in chosen)
        kept = ", ".join(f'"{task_id}"' for task_id in sorted(keep, key=lambda i: tuple(map(int, i.split(".")))))
        path = Path(out) / ASSIGNMENT
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# What this student tree assigns (stubbed, to do) and releases (reference code kept);\n"
                        "# every other task is a stub whose tests skip here. Written by make.\n"
                        f"assigned = [{listed}]\nreleased = [{kept}]\n")
    return chosen
