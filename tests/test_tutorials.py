"""Every tutorial chapter's code runs, as written, on small settings.

In each chapter, ``tutorials/NN_*.md``, the ```python blocks run in order in one namespace, in
this process, from the repository root. A ```python block whose first line is a comment like
``# mpiexec -n 4`` is an MPI program: it is written to a file and run as ``mpiexec -n 4 python FILE``
(timeout 120 s) and must exit 0. Other blocks (```bash, ```text) are shown, not run.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.md"))      # not references.md and the like
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
MPI_LINE = re.compile(r"#\s*mpiexec\s+-n\s+(\d+)")


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


@pytest.mark.timeout(600)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_chapter_code_runs(chapter, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    namespace = {"__name__": f"tutorial_{chapter.stem}"}
    for number, code in enumerate(python_blocks(chapter), 1):
        first = code.lstrip().splitlines()[0] if code.strip() else ""
        match = MPI_LINE.match(first)
        if match:
            script = tmp_path / f"block{number}.py"
            script.write_text(code)
            command = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", match.group(1), sys.executable, str(script)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
            assert done.returncode == 0, f"{chapter.name} block {number} (MPI) failed:\n{done.stdout}\n{done.stderr}"
        else:
            try:
                exec(compile(code, f"{chapter.name}:block{number}", "exec"), namespace)
            except Exception as error:
                raise AssertionError(f"{chapter.name} block {number} failed: {error!r}") from error
