"""Run one python block of a tutorial chapter, as the test suite runs it.

    python -m tutorials.block 04 3              # chapter 04, its third ```python block
    python -m tutorials.block 04 3 --ranks 2    # an MPI block on 2 ranks instead of its own count
    python -m tutorials.block 04 --list         # the chapter's blocks: number, kind, first line

Blocks are numbered from 1 in the order they appear in ``tutorials/NN_*.md``. A block whose first
line is ``# mpiexec -n N`` is an MPI program: it runs alone, as ``mpiexec -n N python FILE``, and
needs nothing from other blocks. Every other block runs in one namespace with the serial blocks
before it, because a chapter builds its variables as it goes (block 5 may use the ``data`` that
block 2 loaded): so ``04 3`` first runs the serial blocks 1 and 2, quietly, then block 3.
BLAS is pinned to one thread per process, as in the test suite. Every MPI block shows this command
on its own ``# run:`` line (a test checks that the chapter and number are its own), and a notebook's
``%%mpiexec -n N`` cells run through ``run_mpi`` below (tutorials/notebook.py).
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from collectives import cli

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
MPI_LINE = re.compile(r"#\s*mpiexec\s+-n\s+(\d+)")
# Runs the file named by its first argument, its stdout written a whole line at a time as soon as it is
# printed: into a pipe, Python would hold it all to the end, and with -u (or reconfigure) print writes the
# text and its newline apart, so two ranks' lines come out spliced.
WHOLE_LINES = """import io, runpy, sys
sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding=sys.stdout.encoding,
                              errors=sys.stdout.errors, line_buffering=True)
sys.argv = sys.argv[1:]                     # as 'python FILE' would have it
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    sys.stdout.flush()
"""


def chapter_file(chapter, root=ROOT):
    """The one ``tutorials/<chapter>*.md`` (``chapter``: '04', '4' or a file name's start)."""
    chapter = chapter.zfill(2) if chapter.isdigit() else chapter
    matches = sorted((Path(root) / "tutorials").glob(f"{chapter}*.md"))
    if len(matches) != 1:
        raise ValueError(f"no single chapter starts with {chapter!r} in {Path(root) / 'tutorials'}")
    return matches[0]


def blocks(path):
    return BLOCK.findall(Path(path).read_text())


def ranks_of(code):
    """N for a block whose first line is ``# mpiexec -n N``, else None."""
    lines = code.strip().splitlines()
    match = MPI_LINE.match(lines[0].strip()) if lines else None
    return int(match.group(1)) if match else None


def run_block(chapter, number, ranks=None, root=ROOT):
    """Run block ``number`` of ``chapter`` (after the serial blocks before it); returns an exit status."""
    path = chapter_file(chapter, root)
    codes = blocks(path)
    if not 1 <= number <= len(codes):
        raise ValueError(f"{path.name} has python blocks 1..{len(codes)}, not {number}")
    code = codes[number - 1]
    env = environment(root)
    mpi_ranks = ranks_of(code)
    if mpi_ranks is None:
        if ranks is not None:
            raise ValueError(f"{path.name} block {number} is not an MPI block ('# mpiexec -n N'): --ranks does not "
                             "apply")
        setup = "\n".join(earlier for earlier in codes[:number - 1] if ranks_of(earlier) is None)
        script = ("import contextlib, io\n"
                  f"with contextlib.redirect_stdout(io.StringIO()):\n    exec(compile({setup!r}, 'earlier blocks', "
                  "'exec'))\n"
                  f"exec(compile({code!r}, '{path.name} block {number}', 'exec'))\n")
        command = [sys.executable, "-c", script]
        return subprocess.run(command, cwd=root, env=env).returncode
    return run_mpi(code, mpi_ranks if ranks is None else ranks, f"{path.stem}_{number}", root)


def environment(root=ROOT):
    """This process's environment, with ``root`` importable and BLAS on one thread per process."""
    return dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                MKL_NUM_THREADS="1")


def run_mpi(code, ranks, name="block", root=ROOT, echo=None):
    """Run ``code`` as ``mpiexec -n ranks python FILE`` from ``root``; returns mpiexec's exit status.

    ``echo`` None lets the ranks write to this process's own stdout and stderr; a function instead
    gets their merged output line by line, as it comes (a notebook cell prints it: tutorials/notebook.py).
    """
    if ranks < 1:
        raise ValueError(f"--ranks must be >= 1, got {ranks}")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    with tempfile.NamedTemporaryFile("w", suffix=f"_{name}.py", delete=False) as file:
        file.write(code)
    command = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(ranks), sys.executable, file.name]
    try:
        if echo is None:
            return subprocess.run(command, cwd=root, env=environment(root)).returncode
        command[-1:] = ["-c", WHOLE_LINES, file.name]
        with subprocess.Popen(command, cwd=root, env=environment(root), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as ranks_running:
            try:
                for line in ranks_running.stdout:
                    echo(line)
                return ranks_running.wait()
            except BaseException:            # an interrupted cell must not leave its ranks running
                ranks_running.terminate()
                ranks_running.wait()
                raise
    finally:
        os.unlink(file.name)


def list_blocks(chapter, root=ROOT):
    path = chapter_file(chapter, root)
    print(path.name)
    for number, code in enumerate(blocks(path), 1):
        ranks = ranks_of(code)
        first = next((line for line in code.splitlines() if line.strip() and not MPI_LINE.match(line.strip())
                      and not line.strip().startswith(("# needs:", "# run:"))), "")
        print(f"{number:>3}  {'mpiexec -n ' + str(ranks) if ranks else 'serial':<13} {first.strip()[:70]}")


def main(argv=None):
    parser = cli.Parser(prog="python -m tutorials.block", description=__doc__.splitlines()[0])
    parser.add_argument("chapter", help="the chapter's number, e.g. 04")
    parser.add_argument("number", type=int, nargs="?", help="the block's number, from 1")
    parser.add_argument("--ranks", type=int, default=None, help="run an MPI block on this many ranks")
    parser.add_argument("--list", action="store_true", help="list the chapter's blocks")
    args = parser.parse_args(argv)
    try:
        if args.list or args.number is None:
            list_blocks(args.chapter)
            return 0
        return run_block(args.chapter, args.number, args.ranks)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
