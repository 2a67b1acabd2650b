"""The README's commands are the ones CI runs, and its tables name modules that exist."""
import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUN_LINE = r"^(?:mpiexec -n \d+ )?python -m algorithms\.{name}(?: |$)"


def readme_commands():
    return re.findall(r"^```bash\n(.*?)\n```", README.read_text(), re.S | re.M)


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = readme_commands()[1]
    assert "tests/run.py" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def run_line(path):
    """The first line of the header's second paragraph (where the command that runs the module stands)."""
    header = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraphs = header.split("\n\n")
    return paragraphs[1].strip().splitlines()[0].strip() if len(paragraphs) > 1 and paragraphs[1].strip() else ""


def commands(package=ROOT / "algorithms"):
    """{name: the file whose header shows its run line} for every ``python -m algorithms.<name>``: a
    module that runs as ``__main__``, or a package with a ``__main__.py`` (its header: the ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts or not re.search(r'^if __name__ == "__main__":', path.read_text(), re.M):
            continue
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__main__":
            found[".".join(parts[:-1])] = path.with_name("__init__.py")
        else:
            found[".".join(parts)] = path
    return found


def test_the_readmes_algorithm_table_and_the_runnable_modules_are_the_same_and_each_shows_its_run_line():
    readme = README.read_text()
    listed = re.findall(r"^\| `algorithms\.([\w.]+)`", readme, re.M)
    runnable = commands()
    assert sorted(listed + ["core.evaluate"]) == sorted(runnable), "README's table and algorithms/ disagree"
    assert "python -m algorithms.core.evaluate" in readme
    for name, header in runnable.items():          # each header opens with the command that runs it
        assert importlib.import_module(f"algorithms.{name}"), name
        line = run_line(header)
        assert re.match(RUN_LINE.format(name=name), line), \
            f"{header.relative_to(ROOT)}: the header's second paragraph should open with its run line, not {line!r}"


def test_a_header_that_only_mentions_its_command_in_prose_has_no_run_line(tmp_path):
    path = tmp_path / "module.py"
    path.write_text('"""Title.\n\nRun it with python -m algorithms.x under mpiexec.\n"""\n')
    assert not re.match(RUN_LINE.format(name="x"), run_line(path))
    path.write_text('"""Title.\n\n    mpiexec -n 4 python -m algorithms.x [--flag]\n"""\n')
    assert re.match(RUN_LINE.format(name="x"), run_line(path))
    assert not re.match(RUN_LINE.format(name="x"), "python -m algorithms.xy")


def named_files(readme):
    """Each file or folder the README's tables name: (where the table says it is, the name)."""
    named = []
    for row in re.findall(r"^\|.*\|$", readme, re.M):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        package = re.fullmatch(r"`(\w+)/`", cells[0])
        for token in re.findall(r"`([^`\s]+)`", " | ".join(cells[1:])):
            if re.fullmatch(r"[\w./]+/[\w.]+\.py|[\w./]+/", token) and "/" in token.rstrip("/"):
                named.append((ROOT, token))                          # a path from the repository root
            elif package and re.fullmatch(r"\w+\.py|\w+/", token):
                named.append((ROOT / package.group(1), token))       # a file of the row's package
    return named


def test_the_readmes_tables_name_files_that_exist():
    named = named_files(README.read_text())
    assert len(named) >= 15, f"the tables name only {named}: is the parsing broken?"
    missing = [str((where / name).relative_to(ROOT)) for where, name in named if not (where / name).exists()]
    assert not missing, f"README's tables name files that do not exist: {missing}"


PACKAGES = ("minidl", "collectives", "algorithms", "tutorials")


def readme_modules(text):
    """Every module of the project the README runs as ``python -m X`` (``algorithms.<name>`` left out: a
    placeholder, whose modules the table lists)."""
    found = re.findall(r"python3? -m ([A-Za-z_][\w.]*\w)(?![\w.<])", text)
    return sorted({name for name in found if name.split(".")[0] in PACKAGES})


# run each module as ``python -m X --help`` in one process (one import of numpy and mpi4py for all);
# the exit status of each, or the error it died of
HELP_ALL = """
import contextlib, io, json, runpy, sys
status = {}
for name in sys.argv[1:]:
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        status[name] = 0
    except SystemExit as stop:
        status[name] = stop.code or 0
    except BaseException as error:
        status[name] = f"{type(error).__name__}: {error}"
print(json.dumps(status))
"""


def help_status(modules, cwd=ROOT):
    import json
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", HELP_ALL, *modules], cwd=cwd, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_module_the_readme_runs_answers_help():
    """Each ``python -m X`` of the README, and each ``algorithms.<name>`` of its table (the placeholder's
    modules), runs and answers ``--help`` with exit status 0."""
    readme = README.read_text()
    table = [f"algorithms.{name}" for name in re.findall(r"^\| `algorithms\.([\w.]+)`", readme, re.M)]
    modules = sorted(set(readme_modules(readme) + table))
    assert {"algorithms.compare", "collectives.bench", "collectives.simulate", "algorithms.memory"} <= set(modules), \
        modules
    failed = {name: status for name, status in help_status(modules).items() if status != 0}
    assert not failed, f"python -m X --help failed for: {failed}"


def test_a_readme_command_whose_module_is_gone_is_seen():
    text = "run `python -m collectives.no_such_module --flag` and `mpiexec -n 4 python -m algorithms.<name>`"
    assert readme_modules(text) == ["collectives.no_such_module"]
    assert help_status(["collectives.no_such_module"])["collectives.no_such_module"].startswith("ImportError")
