"""python -m tutorials.assignments list | make --out DIR [--tasks IDS] [--solutions] | block CHAPTER N"""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from tutorials import assignments

BLOCK = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
MPI_LINE = re.compile(r"#\s*mpiexec\s+-n\s+(\d+)")


def list_tasks():
    tasks, _ = assignments.load()
    print(f"{'task':<5} {'points':>6} {'hours':>5}  {'difficulty':<10} {'requires':<10} title  (file: function)")
    for task in tasks:
        print(f"{task.id:<5} {task.points:>6g} {task.hours:>5g}  {task.difficulty:<10} "
              f"{','.join(task.requires) or '-':<10} {task.title}  ({task.file}: {task.function})")
    print(f"{len(tasks)} tasks, {sum(t.points for t in tasks):g} points, about {sum(t.hours for t in tasks):g} hours")


def run_block(chapter, number, root=Path.cwd()):
    """Run python block ``number`` (1-based) of the chapter whose file starts with ``chapter``."""
    matches = sorted((root / "tutorials").glob(f"{chapter}*.md"))
    if len(matches) != 1:
        raise SystemExit(f"error: no single chapter starts with {chapter!r} in {root / 'tutorials'}")
    blocks = BLOCK.findall(matches[0].read_text())
    if not 1 <= number <= len(blocks):
        raise SystemExit(f"error: {matches[0].name} has python blocks 1..{len(blocks)}, not {number}")
    code = blocks[number - 1]
    mpi = MPI_LINE.match(code.lstrip().splitlines()[0] if code.strip() else "")
    script = root / f".block_{matches[0].stem}_{number}.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    command = [sys.executable, str(script)]
    if mpi:
        command = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", mpi.group(1)] + command
    try:
        return subprocess.run(command, cwd=root, env=env).returncode
    finally:
        script.unlink()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tutorials.assignments", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the tasks, points and prerequisites")
    make = commands.add_parser("make", help="write a student (or instructor) tree")
    make.add_argument("--out", required=True, help="a new folder")
    make.add_argument("--tasks", default=None, help="comma-separated task ids (default: all)")
    make.add_argument("--solutions", action="store_true", help="keep the bodies and hidden tests (instructor)")
    block = commands.add_parser("block", help="run one python block of a chapter")
    block.add_argument("chapter", help="the chapter's number, e.g. 03")
    block.add_argument("number", type=int, help="the block's number, from 1")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            list_tasks()
        elif args.command == "make":
            chosen = assignments.make(args.out, args.tasks, args.solutions)
            what = "instructor tree (solutions kept)" if args.solutions else \
                f"student tree: {len(chosen)} task(s) stubbed ({', '.join(task.id for task in chosen)})"
            print(f"wrote {args.out}: {what}")
        else:
            return run_block(args.chapter, args.number)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
