"""collectives.bench's flags, checked on every rank before its first message, and the targets each row is judged by.

A bad flag, an unwritable output, or a tuning file or calibration that is not one: ``error: ...``
and exit status 2 on every rank (each rank checks its own argv, so all stop alike).
"""
from ..cli import Parser, fail, human, number, output_path, parse_size
from ..model import calibration, tuned

NAMES = ("naive", "tree", "butterfly", "ring", "rabenseifner", "auto")
DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 256 << 10]


def target(name, nbytes, ratio, refined_ratio, calibrated_ratio=None):
    """(text, met) for the performance targets on this row, judged on the rounds' medians: met is True,
    False or None (no target). calibrated_ratio: calibrated model / measured, None where no calibration
    for this p applies."""
    checks = []
    if name in ("auto", "auto_init"):               # auto_init: against MPI's persistent Allreduce_init
        checks.append(("<=1.5x", ratio <= 1.5))
    if name in ("ring", "rabenseifner") and nbytes >= 1 << 20:
        checks.append(("<=1.0x", ratio <= 1.0))
    if refined_ratio is not None and nbytes >= 1 << 20:
        checks.append(("model+-25%", 0.75 <= refined_ratio <= 1.25))
    if calibrated_ratio is not None and nbytes >= 4 << 10:
        checks.append(("cal+-25%", 0.75 <= calibrated_ratio <= 1.25))
    if not checks:
        return "-", None
    return ",".join(text for text, _ in checks), all(ok for _, ok in checks)


def describe(rows):
    return ", ".join(f"{name} from {human(nbytes)}" for nbytes, name in rows)


def tuning_file(flag):
    """The user's tuning file, where --calibrate or --write-selection writes; error where there is none, or
    where the file there is no tuning file (it is not overwritten)."""
    path = tuned.location()
    if path is None:
        fail(f"{flag}: MINIDL_TUNING=none, no tuning file to write"
             + (" (--calibration PATH writes the calibration to a file of its own)" if flag == "--calibrate" else ""))
    try:
        tuned.whole_file(path)
    except ValueError as error:
        fail(f"{flag}: {error} (not overwritten)")
    return path


def settings(argv, size):
    """The checked flags (each rank checks its own argv before its first message: error: and exit 2)."""
    parser = Parser(prog="python -m collectives.bench", description="every allreduce against MPI's and the model")
    parser.add_argument("--sizes", help="comma-separated message sizes, e.g. 4K,1M,64M")
    parser.add_argument("--algorithms", default=",".join(NAMES))
    parser.add_argument("--quick", action="store_true", help="two small sizes, short batches")
    parser.add_argument("--min-time", default="0.02", help="seconds per timed batch")
    parser.add_argument("--rounds", default="7", help="rounds: every row timed once per round, their median kept")
    parser.add_argument("--json", help="write one JSON object per measurement to this file")
    parser.add_argument("--plot", help="write a PNG of time against size")
    parser.add_argument("--persistent", action="store_true",
                        help="also time collectives.persistent's auto (allreduce_init once, start() per call, "
                             "row auto_init) against MPI's persistent Allreduce_init (row mpi_init)")
    parser.add_argument("--write-selection", action="store_true",
                        help="store, for this p, the algorithm measured fastest at each size in the user's tuning "
                             "file, which collectives.auto reads at import")
    parser.add_argument("--calibration", default="tuned",
                        help="the calibrated model's JSON for the 'calibrated' column: 'tuned' (default) this "
                             "machine's from the tuning file, else the shipped one; a path; or none (no column)")
    parser.add_argument("--calibrate", action="store_true",
                        help="fit the calibrated model first, into --calibration (default: the tuning file)")
    parser.add_argument("--median", action="store_true", help="median of single calls (a loaded machine)")
    args = parser.parse_args(argv)
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (
            QUICK_SIZES if args.quick else DEFAULT_SIZES)
    except (ValueError, KeyError, IndexError):
        fail(f"--sizes {args.sizes}: expected sizes such as 4K,1M,64M")
    if any(n < 4 or n % 4 for n in args.sizes):
        fail(f"--sizes: every size must be a multiple of 4 bytes (float32), >= 4; got {args.sizes}")
    args.names = [name.strip() for name in args.algorithms.split(",") if name.strip()]
    unknown = [name for name in args.names if name not in NAMES]
    if unknown:
        fail(f"--algorithms: unknown {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    args.min_time, args.rounds = number("--min-time", args.min_time, 1e-6), number("--rounds", args.rounds, 1, True)
    if args.quick:
        args.min_time, args.rounds = 0.002, 1
    for flag in ("json", "plot"):
        output_path("--" + flag, getattr(args, flag))
    try:
        tuned.current()                         # auto reads its table from it: a bad file stops the bench here
    except ValueError as error:
        fail(str(error))
    if args.write_selection:
        tuning_file("--write-selection")
    args.model, args.model_source = None, "none"
    if args.calibration == "none":                  # no calibrated column (chapter 3's tables)
        if args.calibrate:
            fail("--calibrate needs a --calibration file to write, not none")
    elif args.calibrate:
        if args.calibration == "tuned":
            args.model_source = f"fitted in this job, written to {tuning_file('--calibrate')}"
        else:
            output_path("--calibration", args.calibration)
            args.model_source = f"fitted in this job, written to {args.calibration}"
        if size < 2:
            fail("--calibrate needs at least 2 ranks (it times messages between them)")
    else:
        try:
            if args.calibration == "tuned":
                args.model, args.model_source = calibration.tuned_or_shipped()
            else:
                args.model, args.model_source = calibration.load(args.calibration, required=True), args.calibration
        except ValueError as error:
            fail(str(error))
    return args
