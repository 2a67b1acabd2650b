"""Every fenced heart is a course task, or says in its own module that it is none.

A heart is fenced ``# BEGIN SOLUTION`` / ``# END SOLUTION`` whether or not a course asks students to
write it (tests/test_shape.py: every algorithm module fences its heart). A fence that is a course
task is declared in tutorials/assignments/tasks.toml (tests/test_assignments.py: each task names
one fenced function); one that is not says so in its module, at the top level:

    HEARTS_WITHOUT_A_TASK = ("bucketed_step",)

so a new algorithm needs no course task to be whole, and a fence nobody declared is still caught.
"""
import ast
from pathlib import Path

from tutorials import assignments

ROOT = Path(__file__).resolve().parent.parent
TASKS, _ = assignments.load()
SOURCES = [path for package in ("minidl", "collectives", "algorithms")
           for path in sorted((ROOT / package).rglob("*.py"))]


def declared_without_a_task(text):
    """The names a module's top-level ``HEARTS_WITHOUT_A_TASK = (...)`` lists (a tuple of strings)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(target, ast.Name) and target.id == "HEARTS_WITHOUT_A_TASK"
                                                for target in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def fence_problems(path, registered, root=ROOT):
    """What is wrong with the fences of ``path``: a fence that is no task and not declared so, a declared
    name that is no fenced function, a name both declared and a task."""
    text, where = path.read_text(), path.relative_to(root).as_posix()
    fenced, declared = assignments.fenced_functions(text), declared_without_a_task(text)
    problems = [f"{where}: {name} is fenced but is no task in tasks.toml and not in its HEARTS_WITHOUT_A_TASK"
                for name in fenced if (where, name) not in registered and name not in declared]
    problems += [f"{where}: HEARTS_WITHOUT_A_TASK names {name}, which holds no fence"
                 for name in declared if name not in fenced]
    problems += [f"{where}: {name} is a task in tasks.toml and in HEARTS_WITHOUT_A_TASK"
                 for name in declared if (where, name) in registered]
    return problems


def test_every_fence_is_a_task_or_declared_so_in_its_module():
    registered = {(task.file, task.function) for task in TASKS}
    problems = [problem for path in SOURCES for problem in fence_problems(path, registered)]
    assert not problems, "\n".join(problems)
    declared = [path for path in SOURCES if declared_without_a_task(path.read_text())]
    assert declared, "no module declares a heart without a task: is the declaration read at all?"


def test_an_undeclared_fence_a_stale_declaration_and_a_double_one_are_each_seen(tmp_path):
    module = tmp_path / "toy.py"
    heart = "def step(x):\n    \"\"\"The heart.\"\"\"\n    # BEGIN SOLUTION\n    return x\n    # END SOLUTION\n"
    module.write_text(heart)
    assert fence_problems(module, set(), tmp_path) == [
        "toy.py: step is fenced but is no task in tasks.toml and not in its HEARTS_WITHOUT_A_TASK"]
    module.write_text('HEARTS_WITHOUT_A_TASK = ("step",)\n\n\n' + heart)
    assert fence_problems(module, set(), tmp_path) == []
    assert fence_problems(module, {("toy.py", "step")}, tmp_path) == [
        "toy.py: step is a task in tasks.toml and in HEARTS_WITHOUT_A_TASK"]
    module.write_text('HEARTS_WITHOUT_A_TASK = ("step", "gone")\n\n\n' + heart)
    assert fence_problems(module, set(), tmp_path) == ["toy.py: HEARTS_WITHOUT_A_TASK names gone, which holds no fence"]
