"""Regenerate the numbers chapter 1 quotes outside its blocks (seconds; --quick: about one):

    python tutorials/figures/make_01_figures.py [--quick] [--out DIR]

Chapter 1 has no figure, and its blocks print their own results. The one measured sentence is
section 6's "From a shell: `python -m algorithms.serial_sgd` (about N seconds on 2 cores, about
A% test accuracy)": this script runs ``serial_sgd.train`` with the command line's defaults
(10 epochs) for seeds 0, 1, 2, timing each run in this process's CPU time (one BLAS thread), and
writes out/01_serial.json (per seed: seconds, final test accuracy; and their mean, min and max).
tests/test_chapter_numbers.py checks the sentence against that JSON. --quick: 1 epoch, one seed,
written to /tmp/minidl_01_quick unless --out is given.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "out"                   # what the figure scripts write; the scripts themselves stay in HERE
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import serial_sgd  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch, 1 seed, for CI")
    parser.add_argument("--out", help="output folder (default: tutorials/figures/out, or /tmp/minidl_01_quick with "
                                      "--quick)")
    args = parser.parse_args(argv)
    out = Path(args.out or ("/tmp/minidl_01_quick" if args.quick else OUT))
    out.mkdir(parents=True, exist_ok=True)
    epochs, seeds = (1, (0,)) if args.quick else (10, (0, 1, 2))
    runs = []
    for seed in seeds:
        start = time.process_time()
        _, history = serial_sgd.train(epochs=epochs, seed=seed, quiet=True)
        seconds = time.process_time() - start
        runs.append({"seed": seed, "epochs": epochs, "cpu_seconds": round(seconds, 3),
                     "test_accuracy": history[-1]["test_accuracy"]})
        print(runs[-1])
    accuracies = [run["test_accuracy"] for run in runs]
    times = [run["cpu_seconds"] for run in runs]
    result = {"runs": runs, "test_accuracy": {"mean": sum(accuracies) / len(runs), "min": min(accuracies),
                                              "max": max(accuracies)},
              "cpu_seconds": {"mean": sum(times) / len(runs), "min": min(times), "max": max(times)}}
    (out / "01_serial.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({key: result[key] for key in ("test_accuracy", "cpu_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
