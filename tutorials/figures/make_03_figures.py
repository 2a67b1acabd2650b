"""Regenerate every figure of tutorials/03_collectives.md (run it with plain python: it launches mpiexec).

    python tutorials/figures/make_03_figures.py [--quick] [--out DIR] [--only spacetime|select|bench] [--keep]

spacetime: `mpiexec -n 4 python tutorials/figures/make_03_spacetime.py OUT` traces every algorithm at p = 4 (arrow width
    proportional to the message's bytes) and the ring on the wall clock (span and start skew, cold and
    warm, p = 4 and p = 2, to 03_spacetime_wall.json); then `mpiexec -n 6` draws Rabenseifner's fold-in
    at p = 6. --quick: no p = 6 run.
select: collectives/selection.json, auto's table, from --repeats launches of the whole bench per P = 2
    and 4: at each size the point-to-point algorithm with the smallest median time over the launches.
    One launch is not enough, and neither is a bench of fewer algorithms: where an algorithm's time
    depends on where its buffers landed in memory (the butterfly at 16 KiB on p = 2 ran 10-11 us in
    launches of the five algorithms alone and 17-21 us in launches of the whole bench), the table must
    come from runs like the ones it is judged by. Run it before bench, whose auto rows use the table.
    --quick writes nothing to collectives/ (it only checks that the selection can be computed).
bench: `mpiexec -n P python -m collectives.bench --calibration none --json ...` for P = 2 and 4 (runs kept in
OUT/03_bench_pP.json), then
    03_bench_pP.png: each algorithm's time divided by MPI_Allreduce's at the same size (1.0 marked),
    size on a log axis: the median of --repeats launches (default 3), shaded from min to max. --quick: the
    bench's --quick sizes, one launch, the one select used (select writes no table then, so the bench
    would run the same again). --keep: redraw from the JSON already in OUT without running the
    bench (the full run wants an idle machine: minutes, and 4 ranks on 2 cores).
    03_bench_excerpt.txt: the rows of MPI, the ring, Rabenseifner and auto from each p's first launch,
    in the bench's own columns (measured, x MPI with its rounds' [min, max], the alpha-beta model and the
    refined one, each beside its ratio to the measurement, the target judged on the median and whether
    it is met); chapter 3 prints it verbatim (tests/test_figures_03.py checks).
    03_bench_launches.txt: per p and row with a target, in how many of the launches its median met it.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"

ROOT = Path(__file__).resolve().parents[2]
# the book measures the shipped tables (the selection select writes), never a user's tuning file
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MINIDL_TUNING="none")
RANKS = (2, 4)                                     # the bench's process counts


def mpiexec(n, *args):
    """Run `mpiexec -n n python *args` from the repository root; stop on failure."""
    command = [os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-n", str(n), sys.executable, *args]
    print("$", " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=ROOT, env=ENV, check=True, timeout=1800)


def spacetime(out, quick):
    mpiexec(4, str(ROOT / "tutorials/figures/make_03_spacetime.py"), str(out))   # diagrams at p = 4 and the wall clock
    if not quick:
        mpiexec(6, str(ROOT / "tutorials/figures/make_03_spacetime.py"), str(out))   # Rabenseifner's fold-in at p = 6
    wall = json.loads((out / "03_spacetime_wall.json").read_text())
    cold = wall["first_call_no_barrier"]
    print(f"ring 1 MiB p = 4 wall clock: cold span {cold['span_us']:.0f} us, start skew {cold['start_skew_us']:.0f} us")
    for key in ("warm_after_barrier", "p2_warm_after_barrier"):
        print(f"  {key}: spans {[round(r['span_us']) for r in wall[key]]} us, "
              f"skews {[round(r['start_skew_us']) for r in wall[key]]} us")
    print(f"  untraced median: p = 4 {wall['untraced_median_us']:.0f} us, p = 2 {wall['p2_untraced_median_us']:.0f} us")


def plot_ratios(runs, path):
    """Time relative to MPI_Allreduce against message size, one line per algorithm: the median over the
    runs (each its own launch), shaded from the smallest to the largest run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    records = [r for run in runs for r in run]
    p = records[0]["p"]
    figure, axes = plt.subplots(figsize=(7, 4.2))
    for name in dict.fromkeys(r["algorithm"] for r in records if r["algorithm"] != "mpi"):
        sizes = sorted({r["bytes"] for r in records if r["algorithm"] == name})
        ratios = [[r["ratio"] for r in records if r["algorithm"] == name and r["bytes"] == s] for s in sizes]
        line, = axes.plot(sizes, [np.median(v) for v in ratios], "o-", label=name)
        if len(runs) > 1:
            axes.fill_between(sizes, [min(v) for v in ratios], [max(v) for v in ratios], color=line.get_color(),
                              alpha=0.15, lw=0)
    axes.axhline(1.0, color="black", lw=1.2, ls="--", label="MPI_Allreduce (= 1)")
    axes.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for r in records})
    axes.set_xticks(sizes, [f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" for s in sizes])
    axes.set_ylim(bottom=0)
    axes.set_xlabel("message size (float32 vector)")
    axes.set_ylabel("time / MPI_Allreduce time")
    spread = f"median of {len(runs)} runs, shaded min-max" if len(runs) > 1 else "one run"
    axes.set_title(f"allreduce time relative to MPI's, p = {p}\n({spread}; below 1: faster than MPI)",
                   fontsize=10)
    axes.legend(fontsize=8, frameon=False)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


EXCERPT_ALGORITHMS = ("mpi", "ring", "rabenseifner", "auto")


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def excerpt(runs_by_p):
    """The text of 03_bench_excerpt.txt: each p's first launch, a few algorithms, the bench's columns: each
    time the median over the bench's rounds, `x MPI` the median of the rounds' ratios with [min, max].
    A bench JSON written before the bench kept its rounds (each row the best of 7 batches, no spread)
    prints as it was measured: `x MPI` alone, no rounds named."""
    lines = []
    for p, runs in runs_by_p.items():
        records = runs[0]
        first = records[0]
        rounds = "rounds" in first
        lines.append(f"p = {p}  # ping-pong fit: alpha = {first['alpha'] * 1e6:.2f} us, beta = "
                     f"{first['beta'] * 1e9:.4f} "
                     f"ns/B; gamma = {first['gamma'] * 1e9:.4f} ns/B" + (f"; median of {first['rounds']} rounds"
                                                                         if rounds else ""))
        lines.append(f"{'bytes':>9} {'algorithm':<18} {'measured us':>11} "
                     + (f"{'x MPI [min, max]':>18}" if rounds else f"{'x MPI':>6}") + f" {'model us':>9} "
                     f"{'model/meas':>10} "
                     f"{'refined us':>10} {'ref/meas':>8}  {'target':<17} met")
        for record in records:
            if record["algorithm"] not in EXCERPT_ALGORITHMS:
                continue
            name = record["algorithm"] if record["algorithm"] != "auto" else f"auto({record['model']})"
            refined = record["refined_seconds"]
            refined_text = "-" if refined is None else f"{refined * 1e6:.1f}"
            refined_ratio = "-" if refined is None else f"{record['refined_ratio']:.2f}"
            met = "-" if record["met"] is None else ("met" if record["met"] else "NO")
            if rounds:
                low, high = record["ratio_range"]
                ratio = f"{record['ratio']:.2f} [{low:.2f}, {high:.2f}]".rjust(18)
            else:
                ratio = f"{record['ratio']:6.2f}"
            lines.append(f"{human(record['bytes']):>9} {name:<18} {record['seconds'] * 1e6:11.1f} {ratio} "
                         f"{record['model_seconds'] * 1e6:9.1f} {record['model_seconds'] / record['seconds']:10.2f} "
                         f"{refined_text:>10} {refined_ratio:>8}  {record['target']:<17} {met}")
    return "\n".join(lines) + "\n"


def launches_met(runs_by_p):
    """Per p, how many launches met each row's target (judged on that launch's medians): a line per row
    with a target."""
    lines = []
    for p, runs in runs_by_p.items():
        rows = {}
        for run in runs:
            for record in run:
                if record["met"] is not None:
                    key = (record["bytes"], record["algorithm"], record["target"])
                    rows.setdefault(key, []).append(bool(record["met"]))
        lines.append(f"p = {p}, {len(runs)} launches: " + "; ".join(
            f"{human(n)} {name} {target} {sum(met)} of {len(met)}" for (n, name, target), met in rows.items()))
    return "\n".join(lines) + "\n"


def launches(out, p, quick, repeats):
    """``repeats`` separate launches of the whole bench on p ranks: a list of the bench's own JSON."""
    runs = []
    for _ in range(repeats):                               # separate launches: the noise between runs shows
        part = out / f"03_bench_p{p}.run.json"
        mpiexec(p, "-m", "collectives.bench", "--calibration", "none", "--json", str(part),
                *(["--quick"] if quick else []))
        runs.append(json.loads(part.read_text()))
        part.unlink()
    return runs


def select(out, quick, repeats, launched=None):
    """Median over launches, per p and size, of each point-to-point algorithm; the fastest -> selection.json.
    ``launched``: {p: runs} already made (--quick: the bench's own, since then nothing is written that
    its auto rows would read)."""
    import statistics
    sys.path.insert(0, str(ROOT))
    from collectives import auto
    from collectives.bench.measure import describe
    for p in RANKS:
        runs = launched[p] if launched else launches(out, p, quick, repeats)
        sizes = sorted({r["bytes"] for run in runs for r in run})
        rows = []
        for nbytes in sizes:
            medians = {name: statistics.median(r["seconds"] for run in runs for r in run
                                               if r["algorithm"] == name and r["bytes"] == nbytes)
                       for name in auto.HEARTS}
            fastest = min(medians, key=medians.get)
            if not rows or rows[-1][1] != fastest:
                rows.append([nbytes, fastest])
        print(f"p = {p}, median of {repeats} launches: {describe(rows)}", flush=True)
        if not quick:
            auto.write_selection(p, rows)


def bench(out, quick, keep, repeats, launched=None):
    """03_bench_pP.json: a list of runs, each the bench's own JSON (one record per size and algorithm).
    ``launched``: {p: runs} already made, as for ``select``."""
    for p in RANKS:
        data = out / f"03_bench_p{p}.json"
        if not keep:
            runs = launched[p] if launched else launches(out, p, quick, repeats)
            data.write_text(json.dumps(runs, indent=1))
        runs = json.loads(data.read_text())
        if runs and isinstance(runs[0], dict):             # one run as the bench wrote it
            runs = [runs]
        plot_ratios(runs, out / f"03_bench_p{p}.png")
    runs_by_p = {}
    for p in RANKS:
        runs = json.loads((out / f"03_bench_p{p}.json").read_text())
        runs_by_p[p] = [runs] if runs and isinstance(runs[0], dict) else runs
    (out / "03_bench_excerpt.txt").write_text(excerpt(runs_by_p))
    (out / "03_bench_launches.txt").write_text(launches_met(runs_by_p))
    print(launches_met(runs_by_p))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="cheap settings for CI")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"),
                        help="output folder (default: tutorials/figures/out)")
    parser.add_argument("--only", choices=["spacetime", "select", "bench"], default=None)
    parser.add_argument("--keep", action="store_true", help="bench: redraw from the JSON in OUT, no rerun")
    parser.add_argument("--repeats", type=int, default=None, help="bench launches per p (default 3; --quick 1)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: need at least one bench launch")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "spacetime"):
        spacetime(out, args.quick)
    repeats = args.repeats or (1 if args.quick else 3)
    # --quick writes no selection, so the bench that follows runs as select's launches did: one set serves both
    launched = {p: launches(out, p, True, repeats) for p in RANKS} \
        if args.quick and args.only is None and not args.keep else None
    if args.only in (None, "select") and not args.keep:
        select(out, args.quick, repeats, launched)
    if args.only in (None, "bench"):
        bench(out, args.quick, args.keep, repeats, launched)


if __name__ == "__main__":
    main()
