"""python -m tutorials.assignments list | syllabus | make --out DIR [--tasks IDS] [--released IDS] [--solutions] |
block CHAPTER N | gradescope --out autograder.zip [--tasks IDS]"""
import sys

from collectives import cli
from tutorials import assignments
from tutorials.assignments import gradescope
from tutorials.block import run_block


def list_tasks():
    tasks, _ = assignments.load()
    print(f"{'task':<5} {'points':>6} {'hours':>5}  {'difficulty':<10} {'requires':<10} title  (file: function)")
    for task in tasks:
        print(f"{task.id:<5} {task.points:>6g} {task.hours:>5g}  {task.difficulty:<10} "
              f"{','.join(task.requires) or '-':<10} {task.title}  ({task.file}: {task.function})")
    print(f"{len(tasks)} tasks, {sum(t.points for t in tasks):g} points, about {sum(t.hours for t in tasks):g} hours")


def main(argv=None):
    parser = cli.Parser(prog="python -m tutorials.assignments", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the tasks, points and prerequisites")
    commands.add_parser("syllabus", help="the syllabus and rubric tables of tutorials/assignments/syllabus.md")
    make = commands.add_parser("make", help="write a student (or instructor) tree")
    make.add_argument("--out", required=True, help="a new folder")
    make.add_argument("--tasks", default=None, help="comma-separated task ids to assign (default: all)")
    make.add_argument("--released", default="",
                      help="comma-separated task ids whose reference code the tree keeps besides the assigned "
                           "tasks' prerequisites (every other task is a stub)")
    make.add_argument("--solutions", action="store_true", help="keep the bodies and hidden tests (instructor)")
    block = commands.add_parser("block", help="run one python block of a chapter (as python -m tutorials.block)")
    block.add_argument("chapter", help="the chapter's number, e.g. 03")
    block.add_argument("number", type=int, help="the block's number, from 1")
    zipped = commands.add_parser("gradescope", help="write a Gradescope autograder zip for the tasks")
    zipped.add_argument("--out", required=True, help="the zip to write, e.g. autograder.zip")
    zipped.add_argument("--tasks", default=None, help="comma-separated task ids (default: all)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            list_tasks()
        elif args.command == "syllabus":
            print(assignments.syllabus(), end="")
        elif args.command == "make":
            if args.solutions and args.released:
                raise ValueError("--released with --solutions: an instructor tree keeps every task already")
            chosen = assignments.make(args.out, args.tasks, args.solutions,
                                      also_released=[part for part in args.released.split(",") if part.strip()])
            if args.solutions:
                print(f"wrote {args.out}: instructor tree (solutions kept)")
            else:
                kept = sorted(assignments.assignment(args.out)[1], key=lambda i: tuple(map(int, i.split("."))))
                print(f"wrote {args.out}: student tree assigning {len(chosen)} task(s) "
                      f"({', '.join(task.id for task in chosen)}); reference code kept for "
                      f"{', '.join(kept) or 'no other task'}; every other task is a stub")
        elif args.command == "gradescope":
            chosen = gradescope.build(args.out, args.tasks)
            print(f"wrote {args.out}: Gradescope autograder for task(s) {', '.join(task.id for task in chosen)}")
        else:
            return run_block(args.chapter, args.number)
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
