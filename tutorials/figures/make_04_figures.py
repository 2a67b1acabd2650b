"""Regenerate chapter 4's figures and table (a few minutes on 2 cores):

    python tutorials/figures/make_04_figures.py

1. `mpiexec -n p python -m algorithms.compare` for p = 1, 2, 4 (every algorithm, default settings)
   -> 04_compare_p{p}.json, 04_compare_p4.png, and 04_table.md (accuracy and time per algorithm and p).
2. Model averaging at p = 4 with H = 1, 8, end on iid shards and on label-sorted shards
   -> 04_noniid.json and 04_noniid.png.
Timings depend on the machine and on what else runs on it; the accuracies do not (same seeds).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def mpirun(p, *args):
    command = [MPIEXEC, "-n", str(p), sys.executable, *args]
    print("$", " ".join(command[2:]), flush=True)
    subprocess.run(command, cwd=ROOT, env=ENV, check=True)


def comparison():
    results = {}
    for p in (1, 2, 4):
        path = HERE / f"04_compare_p{p}.json"
        out = HERE / "04_compare_p4.png" if p == 4 else Path("/tmp") / f"04_compare_p{p}.png"
        mpirun(p, "-m", "algorithms.compare", "--out", str(out), "--json", str(path))
        results[p] = json.loads(path.read_text())["histories"]
    names = list(results[1])
    lines = ["| algorithm | " + " | ".join(f"p = {p}: accuracy, time" for p in results) + " |",
             "| --- | " + " | ".join("---" for _ in results) + " |"]
    for name in names:
        cells = [f"{results[p][name][-1]['test_accuracy'] * 100:.1f}%, {results[p][name][-1]['seconds']:.1f} s"
                 for p in results]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (HERE / "04_table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def noniid():
    runs = {}
    for partition in ("shards", "sorted"):
        for period in ("1", "8", "end"):
            log = Path("/tmp") / f"04_noniid_{partition}_{period}.jsonl"
            mpirun(4, "-m", "algorithms.model_averaging", "--partition", partition, "--period", period,
                   "--quiet", "--log", str(log))
            runs[f"{partition}, H = {period}"] = [json.loads(line) for line in log.read_text().splitlines()]
    (HERE / "04_noniid.json").write_text(json.dumps(runs))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for label, history in runs.items():
        style = "-" if label.startswith("shards") else "--"
        axis.plot([r["epoch"] for r in history], [r["test_accuracy"] for r in history], style, marker=".",
                  label=label.replace("shards", "iid shards").replace("sorted", "label-sorted shards"))
    axis.set_xlabel("epoch")
    axis.set_ylabel("test accuracy of the averaged model")
    axis.set_title("model averaging, p = 4: iid vs label-sorted shards")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(HERE / "04_noniid.png", dpi=110)
    for label, history in runs.items():
        print(f"{label:<28} final accuracy {history[-1]['test_accuracy']:.4f}  bytes {history[-1]['bytes']}")


if __name__ == "__main__":
    comparison()
    noniid()
