"""The calibrated cost model against the measured allreduce at p = 2 on this machine.

    python tutorials/figures/make_10_calibration.py            # about 2.5 minutes on 2 cores
    python tutorials/figures/make_10_calibration.py --quick    # 3 sizes, into a temporary folder

Three launches (--launches) of one job, `mpiexec -n 2 python -m collectives.bench --calibrate
--median ...`: each measures the step micro-benchmarks on a ladder of sizes and the 8-byte
allreduces, fits the calibrated model (collectives.model.calibration), and, in the same rounds, size by
size, times every point-to-point allreduce at 4 KiB .. 64 MiB, with the plain alpha-beta-gamma
model (one ping-pong, one add) and the calibrated one beside each time. The first launch's model
goes to collectives/model/calibration.json, the shipped calibration a machine that never tuned reads
(only when writing the book's own folder: not with --quick or another --out), and its rows to the
table; each other launch adds a line: how many rows it met, its worst ratio, and how hot the machine
was (the model's header: the state changed between launches).
-> OUT/10_calibration.json (the fitted model and what it was fitted on), OUT/10_calibrated.json
(one row per size and algorithm, with the machine's load average), OUT/10_calibrated.md, and
OUT/10_steps.md: per ladder size, the step times the model is made of (calibrate.fit_steps), the
two-step pairs and the hot steps (ones that send what a reduction just wrote) taken from them.

The target column: calibrated / measured within 0.75 .. 1.25 at every size >= 4 KiB. Medians of
single calls, since the machine this runs on is shared; the load average is printed beside.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from collectives.model import calibration  # noqa: E402

# the shipped fit is fitted and judged on the shipped tables, never on a user's tuning file
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT),
           MINIDL_TUNING="none")
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
ALGORITHMS = "naive,tree,butterfly,ring,rabenseifner"
SIZES, QUICK_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M", "4K,256K,4M"


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB" if nbytes >= 1 << 10 else f"{nbytes} B"


def markdown(rows, model, load):
    lines = [f"p = 2; step times measured at {len(model['sizes'])} sizes, {human(model['sizes'][0])} .. "
             f"{human(model['sizes'][-1])}; load average (1 minute) {load[0][0]:.1f} before, "
             f"{load[1][0]:.1f} after, on {os.cpu_count()} cores.", "",
             "| bytes | algorithm | measured us | alpha-beta-gamma us | plain / measured | calibrated us "
             "| calibrated / measured | target | met |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        cells = [human(row["bytes"]), row["algorithm"], f"{row['seconds'] * 1e6:.1f}",
                 f"{row['model_seconds'] * 1e6:.1f}",
                 f"{row['model_seconds'] / row['seconds']:.2f}", f"{row['calibrated_seconds'] * 1e6:.1f}",
                 f"{row['calibrated_ratio']:.2f}", "0.75-1.25", "yes" if row["within"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    plain = sum(0.75 <= r["model_seconds"] / r["seconds"] <= 1.25 for r in rows)
    return "\n".join(lines + ["", f"Within 25%: {sum(r['within'] for r in rows)} of {len(rows)} rows (calibrated); "
                                   f"the plain model: {plain} of {len(rows)}."]) + "\n"


def steps_table(model):
    """The calibration's step times (calibrate.fit_steps), one row per ladder size n."""
    names = ("exchange", "exchange_whole", "one_way", "add_into", "pair_w", "reduce", "pair_x", "hot_exchange",
             "pair_1", "pair_1_cold", "hot_one_way")
    heads = ("exchange n/2", "exchange n", "one way n", "add n alone", "butterfly written out (pair_w)",
             "its add (reduce)", "ring written out (pair_x)", "its hot second exchange", "tree written out (pair_1)",
             "pair_1, cold send-back", "its hot send-back")
    lines = ["| n | " + " | ".join(f"{head} us" for head in heads) + " |", "| --- " * (len(heads) + 1) + "|"]
    for row in model["measurements"]["ladder"]:
        lines.append("| " + " | ".join([human(row["bytes"])] + [f"{row[name] * 1e6:.1f}" for name in names]) + " |")
    return "\n".join(lines) + "\n"


def as_typed(command, out):
    """The bench's command as a reader types it, with no path of this machine in it: ``mpiexec`` and
    ``python`` by name, the files it wrote into the output folder as OUT/name."""
    names = {MPIEXEC: "mpiexec", sys.executable: "python"}
    return " ".join(names.get(part) or (f"OUT/{Path(part).name}" if Path(part).parent == out else part)
                    for part in command)


def launch(command, model_path, bench_path):
    """One job of the bench: (rows, model, [load before, load after])."""
    load_before = os.getloadavg()
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.stderr.write(f"error: the bench exited {done.returncode}:\n{done.stderr[-3000:]}\n")
        sys.exit(2)
    load = [load_before, os.getloadavg()]
    rows = []
    for record in json.loads(bench_path.read_text()):
        if record["algorithm"] == "mpi":
            continue
        ratio = record["calibrated_ratio"]
        rows.append({key: record[key] for key in ("algorithm", "p", "bytes", "seconds", "model_seconds",
                                                  "calibrated_seconds", "calibrated_ratio", "load_average")}
                    | {"within": 0.75 <= ratio <= 1.25})
    bench_path.unlink()
    return rows, json.loads(model_path.read_text()), load


def summary(rows, model):
    """One launch in a line's worth of numbers: rows within 25%, the worst ratio, and how hot the
    tree's send-back was at 256 KiB (pair_1 / pair_1_cold: the machine's state, see the model's header)."""
    worst = max(rows, key=lambda r: abs(math.log(r["calibrated_ratio"])))
    at = next(row for row in model["measurements"]["ladder"] if row["bytes"] == 256 << 10)
    return {"within": sum(r["within"] for r in rows), "rows": len(rows), "worst_algorithm": worst["algorithm"],
            "worst_bytes": worst["bytes"], "worst_ratio": worst["calibrated_ratio"],
            "heat_256k": at["pair_1"] / at["pair_1_cold"], "tree_256k_us": next(
                r["seconds"] for r in rows if r["algorithm"] == "tree" and r["bytes"] == 256 << 10) * 1e6
            if any(r["bytes"] == 256 << 10 for r in rows) else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes, shorter timings, a temporary folder")
    parser.add_argument("--launches", type=int, help="jobs, each fitting and checking its own model (default 3; "
                        "--quick: 1); the table shows the first, a line each of the others")
    parser.add_argument("--out", help="folder for the results (default tutorials/figures/out; --quick: a temporary "
                                      "one)")
    args = parser.parse_args()
    launches = args.launches or (1 if args.quick else 3)
    if launches < 1:
        parser.error("--launches must be >= 1")
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp()) if args.quick else HERE / "out")
    out.mkdir(parents=True, exist_ok=True)
    bench_path = out / "10_calibrated_bench.json"
    results = []
    for k in range(launches):
        model_path = out / f"10_calibration_{k}.json"
        command = [MPIEXEC, "-n", "2", sys.executable, "-m", "collectives.bench", "--calibrate", "--median",
                   "--calibration", str(model_path), "--algorithms", ALGORITHMS,
                   "--sizes", QUICK_SIZES if args.quick else SIZES, "--min-time", "0.003" if args.quick else "0.01",
                   "--rounds", "1" if args.quick else "9", "--json", str(bench_path)]
        results.append(launch(command, model_path, bench_path))
    ships = not args.quick and out.resolve() == (HERE / "out").resolve()   # the book's own run: the shipped fit
    for k in range(launches):             # the first launch's model is the one kept
        if k == 0:
            shutil.copyfile(out / "10_calibration_0.json", out / "10_calibration.json")
            if ships:
                shutil.copyfile(out / "10_calibration_0.json", calibration.CALIBRATION_FILE)
        (out / f"10_calibration_{k}.json").unlink()
    rows, model, load = results[0]
    launched = [summary(r, m) for r, m, _ in results]
    (out / "10_calibrated.json").write_text(json.dumps({"rows": rows, "load_average": load, "launches": launched,
                                                         "command": as_typed(command, out)}, indent=1))
    text = markdown(rows, model, load) + launches_line(launched)
    (out / "10_calibrated.md").write_text(text)
    (out / "10_steps.md").write_text(steps_table(model))
    print(text + "\n" + steps_table(model))
    print(f"wrote {out / '10_calibrated.md'}, {out / '10_steps.md'}, {out / '10_calibrated.json'}, "
          f"{out / '10_calibration.json'}" + (f" and {calibration.CALIBRATION_FILE}" if ships else ""))


def launches_line(launched):
    if len(launched) < 2:
        return ""
    cells = "; ".join(f"{s['within']} of {s['rows']}, worst {s['worst_algorithm']} at {human(s['worst_bytes'])} "
                      f"({s['worst_ratio']:.2f}), tree at 256 KiB {s['tree_256k_us']:.1f} us, "
                      f"its send-back hot / cold {s['heat_256k']:.2f}" for s in launched)
    return f"\nThe same job launched {len(launched)} times, each fitting and checking its own model: {cells}.\n"


if __name__ == "__main__":
    main()
