"""Every tutorial chapter's code runs, as written, on small settings, as a notebook.

Each chapter, ``tutorials/NN_*.md``, becomes its notebook (tutorials/notebook.py), which a python3
kernel runs from a temporary folder: the ```python blocks run in order in one namespace, in the
kernel, from the repository root (the notebook's set-up cell moves there). A ```python block whose
first line is a comment like ``# mpiexec -n 4`` is an MPI program: its cell runs it as
``mpiexec -n 4 python FILE`` (the ``%%mpiexec`` magic) and must exit 0. Other blocks (```bash,
```text) are shown, not run. Outputs the prose quotes, where deterministic, are checked.

A block that runs a course-assignment task's code (tutorials/assignments/tasks.toml) says so in a
comment line ``# needs: 3.4, 3.5`` (its first line, or its second after ``# mpiexec -n N``). In a
student tree (``python -m tutorials.assignments make``) a block that needs a task whose body is still
the generated stub is skipped, and so is the rest of its chapter (later blocks use its variables);
in the reference tree no task is stubbed and every block runs.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import MPI_LINE, NEEDS_LINE, needs
from tutorials.assignments import load, stubbed

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.md"))      # not references.md and the like
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


def python_blocks(path):
    return BLOCK.findall(path.read_text())


def test_readme_links_every_chapter_and_every_chapter_has_code_that_runs_here():
    # The parametrised test below passes vacuously for a chapter with no python block, and does
    # not exist at all for a chapter the glob misses; this checks the set of chapters and blocks.
    linked = re.findall(r"\]\((tutorials/\d\d_[^)#]+\.md)\)", (ROOT / "README.md").read_text())
    assert sorted(set(linked)) == [f"tutorials/{path.name}" for path in CHAPTERS], \
        "README's tutorials table and tutorials/NN_*.md disagree"
    for other in sorted(set((ROOT / "tutorials").glob("*.md")) - set(CHAPTERS)):
        assert not python_blocks(other), f"{other.name} has ```python blocks but is no chapter, so they never run"
    for chapter in CHAPTERS:
        blocks = python_blocks(chapter)
        assert blocks, f"{chapter.name} has no ```python block, so nothing of it is tested"
        for number, code in enumerate(blocks, 1):
            first = code.lstrip().splitlines()[0] if code.strip() else ""
            if "mpiexec" in first or "mpirun" in first:
                match = MPI_LINE.match(first)
                assert match, f"{chapter.name} block {number}: {first!r} is no '# mpiexec -n P': it runs serially"
                assert 1 <= int(match.group(1)) <= 8, \
                    f"{chapter.name} block {number} asks for {match.group(1)} ranks; tests run 1..8"


def test_every_needs_line_names_known_tasks_where_it_is_read():
    known = {task.id for task in load()[0]}
    for chapter in CHAPTERS:
        for number, code in enumerate(python_blocks(chapter), 1):
            named = needs(code)
            assert set(named) <= known, f"{chapter.name} block {number} needs unknown task(s) {set(named) - known}"
            anywhere = [line for line in code.splitlines() if NEEDS_LINE.match(line.strip())]
            assert len(anywhere) == (1 if named else 0), (f"{chapter.name} block {number}: a '# needs:' line "
                                                          "must be the first line (the second after '# mpiexec -n N')")


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)[^)]*\)")        # [text](target) and ![alt](target), anchors dropped


def test_every_link_and_image_of_the_readme_and_the_tutorials_points_at_a_file_that_exists():
    # the figures the chapters show live in tutorials/figures/out/, apart from the scripts that write them
    pages = [ROOT / "README.md", *sorted(path for path in (ROOT / "tutorials").rglob("*.md")
                                         if "out" not in path.relative_to(ROOT / "tutorials").parts)]
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if not re.match(r"[a-z]+:", target):          # not https:, mailto:
                assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}: no such file"


def test_the_assignments_readme_plans_with_the_registrys_numbers():
    # tutorials/assignments/README.md quotes the task count and each chapter's points and hours; README.md the count
    tasks = load()[0]
    text = (ROOT / "tutorials" / "assignments" / "README.md").read_text()
    assert f"The {len(tasks)} hearts" in text, "the README's task count differs from tasks.toml"
    points = sum(t.points for t in tasks)
    counted = f"all {len(tasks)} tasks, all {points:g} points" in text and "tasks are not sandboxed" not in text
    assert counted, "the README counts the tasks and their points (every one sandboxed) differently from tasks.toml"
    syllabus = (ROOT / "tutorials" / "assignments" / "syllabus.md").read_text()
    assert f"({points:g} in all)" in syllabus, "syllabus.md's rubric totals the points differently from tasks.toml"
    assert f"are {len(tasks)} course tasks" in (ROOT / "README.md").read_text(), \
        "README.md's 'Teaching with minidl' counts the tasks differently from tasks.toml"
    rows = re.findall(r"^\| (\d+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
    assert [int(chapter) for chapter, _, _ in rows] == sorted({task.chapter for task in tasks})
    for chapter, points, hours in rows:
        mine = [task for task in tasks if task.chapter == int(chapter)]
        assert (float(points), float(hours)) == (sum(t.points for t in mine), sum(t.hours for t in mine)), \
            f"chapter {chapter}: the README's points and hours differ from tasks.toml"


# Numbers a chapter's prose quotes from the output of its own blocks, where that output is deterministic:
# (chapter, a pattern that finds the number in the prose, the output line that must show it). The notebook's
# cells must print them. Chapter 1's first block prints the gradient 2x + 3 at x = 1, 2, 3, worked by hand.
QUOTED_OUTPUTS = [
    ("01", None, r"dy/dx = \[5\. 7\. 9\.\]"),
    ("02", r"its total \((\d+\.\d) MiB\)", r"winograd .*scratch +{} MiB in float32"),
    ("04", r"On 4 ranks it prints a spread of (\S+) from round 2 on", r"after +2 rounds: spread {},"),
    ("06", r"only below a batch of about (\d+) here", r"sends less than data parallelism below batch {}$"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_chapter_code_runs(chapter, tmp_path):
    # The chapter runs once, as a student runs it: its generated notebook (tutorials/notebook.py), written
    # into a temporary folder and run there by a python3 kernel of this environment (nbclient). Its serial
    # blocks run in the kernel in order, in one namespace; each MPI block runs as an '%%mpiexec -n N' cell
    # (tutorials/block.py's run_mpi); any failing cell fails the test. The notebook has no path of this
    # checkout in it (it finds the root from the minidl it imports), and its deterministic outputs are the
    # numbers the prose quotes (QUOTED_OUTPUTS). In a student tree the cells stop at the first block that
    # needs a task still stubbed, and the test skips, saying which. The same run tells
    # tests/test_prerequisites.py which tasks each block ran (tests/chapter_run.py), whichever test comes first.
    for module in ("jupytext", "nbclient", "ipykernel"):
        pytest.importorskip(module, reason=f"{module} comes with the test extra: pip install -e '.[test]'")
    from tests.chapter_run import chapter_run

    done = chapter_run(chapter, tmp_path)
    assert str(ROOT) not in done.written, f"{chapter.stem}.ipynb names this checkout's path: it runs only here"
    # its figures travel inside it, and no link of its prose points at a file beside it (it opens anywhere)
    figures = set(re.findall(r"!\[[^\]]*\]\(figures/out/([^)\s]+)\)", chapter.read_text()))
    attached = {name for cell in done.made.cells for name in cell.get("attachments", {})}
    assert attached == figures, \
        f"{chapter.stem}.ipynb: attached {sorted(attached)}, the chapter shows {sorted(figures)}"
    prose = "".join(cell.source for cell in done.made.cells if cell.cell_type == "markdown")
    assert not [target for target in LINK.findall(prose) if not re.match(r"[a-z]+:|#", target)], \
        f"{chapter.stem}.ipynb links files by relative path"
    assert len(done.code) == len(python_blocks(chapter))
    if done.error is not None:
        raise AssertionError(f"{chapter.name} block {done.failed} failed in the notebook:\n{done.error}")
    printed = "".join(output.get("text", "") for cell in done.book.cells if cell.cell_type == "code"
                      for output in cell.outputs)
    for number, prose, shown in QUOTED_OUTPUTS:
        if chapter.name.startswith(number) and done.waiting is None:
            if prose:
                quoted = re.search(prose, chapter.read_text())
                assert quoted, f"{chapter.name}: the sentence that quotes the output ({prose!r}) is gone"
                shown = shown.format(re.escape(quoted.group(1)))
            assert re.search(shown, printed, re.M), f"{chapter.name}: no output line matches {shown!r}"
    if done.waiting:
        pytest.skip(done.waiting)


def test_the_block_runner_runs_one_block_after_the_serial_blocks_it_builds_on(tmp_path):
    # chapter 1's block 5 uses `image` and `columns`, which block 4 builds (and prints): run alone,
    # block 5 must run the serial blocks before it first, quietly
    run = [sys.executable, "-m", "tutorials.block"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([*run, "01", "5"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[[ 0.  1.  2.  3.]" not in done.stdout, "the earlier blocks' output should be quiet"
    listing = subprocess.run([*run, "04", "--list"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert re.search(r"^\s+2\s+mpiexec -n 4 ", listing.stdout, re.M), listing.stdout
    bad = subprocess.run([*run, "01", "5", "--ranks", "2"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "not an MPI block" in bad.stderr
    missing = subprocess.run([*run, "01", "99"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "python blocks 1.." in missing.stderr


RUN_LINE = re.compile(r"#\s*run:\s*(.*)$")


def test_every_mpi_block_shows_the_command_that_runs_it_alone():
    # A chapter's "Running this chapter" note names its own number, and says that each MPI block shows its
    # command: the line after '# mpiexec -n N' (and after the '# needs:' line, where there is one) is
    # '# run: OMP_NUM_THREADS=1 python -m tutorials.block NN K', naming the block's own chapter and number,
    # which move when a block is added or removed above it. A '# run:' line anywhere must be right.
    for chapter in CHAPTERS:
        text = chapter.read_text()
        note = re.search(r"^\*\*Running this chapter\.\*\*(.*?)\n\n", text, re.S | re.M)
        assert note, f"{chapter.name} has no '**Running this chapter.**' note"
        if note:
            for command in ("tutorials.block", "tutorials.notebook"):
                named = set(re.findall(rf"python -m {command} (\d\d)", note.group(1)))
                assert named == {chapter.name[:2]}, f"{chapter.name}: its note runs {command} on chapter(s) {named}"
        for number, code in enumerate(python_blocks(chapter), 1):
            lines = code.lstrip().splitlines()
            runs = [line.strip() for line in lines if RUN_LINE.match(line.strip())]
            mpi = bool(lines and MPI_LINE.match(lines[0]))
            if not (mpi and note or runs):
                continue
            where = int(mpi) + int(bool(needs(code)))
            expected = f"# run: OMP_NUM_THREADS=1 python -m tutorials.block {chapter.name[:2]} {number}"
            assert runs == [expected] and lines[where].strip() == expected, \
                f"{chapter.name} block {number}: its line {where + 1} should be {expected!r}, found {runs}"


def test_every_chapter_becomes_a_notebook_of_its_own_blocks(tmp_path, capsys):
    # tutorials/notebook.py reads a chapter with jupytext: its code cells must be the blocks the tests
    # run, in order, an MPI block under '%%mpiexec -n N' with its own N, and ```bash/```text blocks no code
    pytest.importorskip("jupytext", reason="jupytext comes with the test extra: pip install -e '.[test]'")
    import nbformat

    from tutorials import notebook

    for chapter in CHAPTERS:
        book = notebook.notebook(chapter.name[:2])
        nbformat.validate(book)
        cells = book.cells
        assert cells[1].source.endswith("%load_ext tutorials.notebook")
        code = [cell.source for cell in cells[2:] if cell.cell_type == "code"]
        expected = []
        for block in python_blocks(chapter):
            lines = block.rstrip("\n").splitlines()
            match = MPI_LINE.match(lines[0]) if lines else None
            expected.append("\n".join([f"%%mpiexec -n {match.group(1)}", *lines[1:]]) if match else "\n".join(lines))
        assert code == expected, f"{chapter.name}: the notebook's code cells differ from the chapter's python blocks"
    # the command line writes one, and will not overwrite it (a student's edits) without --force
    assert notebook.main(["03", "--out", str(tmp_path)]) == 0 and (tmp_path / f"{CHAPTERS[2].stem}.ipynb").exists()
    assert notebook.main(["03", "--out", str(tmp_path)]) == 2 and "--force" in capsys.readouterr().err
    assert notebook.main(["03", "--out", str(tmp_path), "--force"]) == 0


@pytest.mark.timeout(120)
def test_chapter_one_runs_as_a_notebook_and_mpi_cells_run_through_the_magic(tmp_path, monkeypatch):
    # The student's path, end to end: the generated notebook of chapter 1 runs in a real Jupyter kernel
    # (nbclient, ipykernel), and an '%%mpiexec -n 2' cell runs on two ranks and prints in the notebook;
    # a cell whose ranks fail stops with MPIBlockFailed. In a student tree the chapter's cells stop at the
    # first block that needs a task still stubbed, as test_chapter_code_runs does; the MPI cells run anyway.
    for module in ("jupytext", "nbclient", "ipykernel"):
        pytest.importorskip(module, reason=f"{module} comes with the test extra: pip install -e '.[test]'")
    import nbformat

    from tutorials import notebook

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))        # the kernel's connection file,
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))     # and its profile: not in the home directory
    book = notebook.notebook("01", out=tmp_path)
    for index, cell in enumerate(book.cells):
        if cell.cell_type == "code" and any(stubbed(task, root=ROOT) for task in needs(cell.source)):
            book.cells = book.cells[:index]
            break
    ranks = ("%%mpiexec -n 2\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\n"
             "print(f'rank {comm.rank} of {comm.size}: sum {comm.allreduce(comm.rank + 1)}')")
    failing = "%%mpiexec -n 2\nfrom mpi4py import MPI\nassert MPI.COMM_WORLD.rank == 0, 'rank 1 fails'"
    book.cells += [nbformat.v4.new_code_cell(ranks),
                   nbformat.v4.new_code_cell(failing, metadata={"tags": ["raises-exception"]})]
    notebook.execute(book, timeout=60)
    code = [cell for cell in book.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code), "a cell did not run"
    printed = ["".join(output.get("text", "") for output in cell.outputs) for cell in code]
    if len(code) > 3:                    # chapter 1's first block: y = sum(x^2 + 3x) at x = 1, 2, 3
        assert "dy/dx = [5. 7. 9.]" in printed[1]
    assert sorted(printed[-2].splitlines()) == ["rank 0 of 2: sum 3", "rank 1 of 2: sum 3"]
    errors = [output for output in code[-1].outputs if output.output_type == "error"]
    assert [error.ename for error in errors] == ["MPIBlockFailed"] and "rank 1 fails" in printed[-1]
