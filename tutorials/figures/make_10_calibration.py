"""The calibrated cost model against the measured allreduce at p = 2 on this machine.

    python tutorials/figures/make_10_calibration.py            # about a minute on 2 cores
    python tutorials/figures/make_10_calibration.py --quick    # 3 sizes, into a temporary folder

One job, `mpiexec -n 2 python -m collectives.bench --calibrate --median ...`: it measures the
micro-benchmark ladder and the 8-byte allreduces, fits the calibrated model (collectives.calibration)
and writes it to collectives/calibration.json (the file the bench reads by default; --quick: a
temporary one), then times every point-to-point allreduce at 4 KiB .. 64 MiB and sets the plain
alpha-beta-gamma model (one ping-pong, one add) and the calibrated one beside each time.
-> OUT/10_calibration.json (the fitted model and what it was fitted on), OUT/10_calibrated.json
(one row per size and algorithm, with the machine's load average), OUT/10_calibrated.md, and
OUT/10_steps.md: per ladder size, the step times the model is made of (calibrate.fit_steps), the
two-step pairs and the hot steps (ones that send what a reduction just wrote) taken from them.

The target column: calibrated / measured within 0.75 .. 1.25 at every size >= 4 KiB. Medians of
single calls, since the machine this runs on is shared; the load average is printed beside.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from collectives import calibration  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
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
        cells = [human(row["bytes"]), row["algorithm"], f"{row['seconds'] * 1e6:.1f}", f"{row['model_seconds'] * 1e6:.1f}",
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 sizes, shorter timings, a temporary folder")
    parser.add_argument("--out", help="folder for the results (default tutorials/figures/out; --quick: a temporary one)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp()) if args.quick else HERE / "out")
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / "10_calibration.json" if args.quick else calibration.CALIBRATION_FILE
    bench_path = out / "10_calibrated_bench.json"
    load_before = os.getloadavg()
    command = [MPIEXEC, "-n", "2", sys.executable, "-m", "collectives.bench", "--calibrate", "--median",
               "--calibration", str(model_path), "--algorithms", ALGORITHMS, "--sizes", QUICK_SIZES if args.quick else SIZES,
               "--min-time", "0.003" if args.quick else "0.01", "--rounds", "1" if args.quick else "9",
               "--json", str(bench_path)]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.stderr.write(f"error: the bench exited {done.returncode}:\n{done.stderr[-3000:]}\n")
        sys.exit(2)
    load = [load_before, os.getloadavg()]
    if not args.quick:
        shutil.copyfile(model_path, out / "10_calibration.json")
    model = json.loads(model_path.read_text())
    rows = []
    for record in json.loads(bench_path.read_text()):
        if record["algorithm"] == "mpi":
            continue
        ratio = record["calibrated_ratio"]
        rows.append({key: record[key] for key in ("algorithm", "p", "bytes", "seconds", "model_seconds",
                                                  "calibrated_seconds", "calibrated_ratio", "load_average")}
                    | {"within": 0.75 <= ratio <= 1.25})
    bench_path.unlink()
    (out / "10_calibrated.json").write_text(json.dumps({"rows": rows, "load_average": load,
                                                         "command": " ".join(command[1:])}, indent=1))
    text = markdown(rows, model, load)
    (out / "10_calibrated.md").write_text(text)
    (out / "10_steps.md").write_text(steps_table(model))
    print(text + "\n" + steps_table(model))
    print(f"wrote {out / '10_calibrated.md'}, {out / '10_steps.md'}, {out / '10_calibrated.json'}, "
          f"{out / '10_calibration.json'}"
          + ("" if args.quick else f" and {model_path}"))


if __name__ == "__main__":
    main()
