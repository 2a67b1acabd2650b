"""Every tutorial chapter's code runs, as written, on small settings.

In each ``tutorials/*.md``, the ```python blocks run in order in one namespace, in this process,
from the repository root. A ```python block whose first line is a comment like ``# mpiexec -n 4``
is an MPI program: it is written to a file and run as ``mpiexec -n 4 python FILE`` (timeout 120 s)
and must exit 0. Other blocks (```bash, ```text) are shown, not run.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "tutorials").glob("*.md"))
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
MPI_LINE = re.compile(r"#\s*mpiexec\s+-n\s+(\d+)")


def python_blocks(path):
    return BLOCK.findall(path.read_text())


def test_there_is_a_chapter_with_code():
    assert CHAPTERS and any(python_blocks(path) for path in CHAPTERS)


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
