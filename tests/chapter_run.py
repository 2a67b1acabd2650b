"""One run of a tutorial chapter's notebook, for the two tests that check it.

tests/test_tutorials.py's ``test_chapter_code_runs`` needs the chapter's blocks to run, as its notebook, as a
student runs it; tests/test_prerequisites.py's ``test_every_blocks_needs_line_names_the_tasks_it_runs``
needs to know which tasks each block runs. One run serves both: in the reference tree the kernel also
records, cell by cell, the task bodies each block enters (tests/task_calls.py), and the run is kept for
the other test (tests/conftest.py's ``TOGETHER`` puts both in one pytest-xdist worker; in another
process the run is simply made again). The notebook's cells are the student's, unchanged: the recorder
comes in through an IPython start-up file of the kernel's own profile folder, and starts only once
the notebook's set-up cell has run, so it cannot stand in for anything that cell must do.
"""
import contextlib
import copy
import dataclasses
import os
from pathlib import Path

from tests.helpers import needs
from tutorials import assignments
from tutorials.block import chapter_file

ROOT = Path(__file__).resolve().parent.parent

# The kernel's start-up file: once the set-up cell has run (the checkout is on sys.path, the magic
# loaded), tests/task_calls.py watches every later cell. {out!r}: the record's path.
START = """\
def _minidl_task_calls(out):
    from IPython import get_ipython
    shell = get_ipython()

    def after_set_up(result):
        shell.events.unregister("post_run_cell", after_set_up)
        from tests import task_calls
        task_calls.watch_kernel(shell, out)

    shell.events.register("post_run_cell", after_set_up)


_minidl_task_calls({out!r})
del _minidl_task_calls
"""


@dataclasses.dataclass
class Run:
    made: object          # the notebook as generated (nbformat node), before it ran
    written: str          # the text of its .ipynb file
    book: object          # the notebook after the run: its cells up to a block that waits, with outputs
    code: list            # the indices in ``book.cells`` of the chapter's blocks (the set-up cell not counted)
    waiting: str          # why the rest of the chapter waits (a student tree), or None
    error: str            # the failing cell's error, or None
    failed: object        # the number of the block that failed, "?" if none is found, or None
    calls: dict           # reference tree: {block number: the task ids it ran} for the blocks that ran; else None


RUNS = {}


def chapter_run(chapter, folder):
    """The run of ``chapter`` ('05' or its file), made in ``folder`` if this process has not made it yet."""
    path = chapter_file(chapter[:2] if isinstance(chapter, str) else Path(chapter).name[:2])
    if path.name not in RUNS:
        RUNS[path.name] = run(path, Path(folder))
    return RUNS[path.name]


@contextlib.contextmanager
def kernel_place(folder):
    """Work in ``folder``, with the kernel's connection file and profile in it (not in $HOME), BLAS on one thread."""
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(JUPYTER_RUNTIME_DIR=str(folder / "runtime"), IPYTHONDIR=str(folder / "ipython"),
                      OMP_NUM_THREADS="1")
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def run(path, folder):
    """Write the chapter's notebook into ``folder`` and run it there in a python3 kernel (nbclient)."""
    import nbformat
    from nbclient.exceptions import CellExecutionError

    from tutorials import notebook

    record = None if assignments.is_student_tree(ROOT) else folder / "calls.tsv"
    with kernel_place(folder):
        book = notebook.notebook(path.name[:2], out=folder)
        written = folder / f"{path.stem}.ipynb"
        nbformat.write(book, written)
        made = copy.deepcopy(book)
        code = [index for index, cell in enumerate(book.cells) if cell.cell_type == "code"][1:]   # after set-up
        waiting = error = failed = None
        for number, index in enumerate(code, 1):
            not_done = [task for task in needs(book.cells[index].source) if assignments.stubbed(task, root=ROOT)]
            if not_done:                 # a student tree: this block and the rest of the chapter wait
                waiting = f"{path.name}: block {number} needs task {not_done[0]}, which is not done yet"
                book.cells = book.cells[:index]
                break
        if record is not None:
            startup = folder / "ipython" / "profile_default" / "startup"
            startup.mkdir(parents=True)
            (startup / "00_task_calls.py").write_text(START.format(out=str(record)))
        try:
            notebook.execute(book, timeout=240, folder=folder)
        except CellExecutionError as raised:
            error = str(raised)
            failed = next((number for number, index in enumerate(code, 1)
                           if index < len(book.cells) and any(output.get("output_type") == "error"
                                                              for output in book.cells[index].get("outputs", []))), "?")
    calls = None
    if record is not None:
        lines = record.read_text().splitlines() if record.exists() else []
        calls = {int(number): set(filter(None, tasks.split(",")))
                 for number, tasks in (line.split("\t") for line in lines)}
    return Run(made, written.read_text(), book, code, waiting, error, failed, calls)
