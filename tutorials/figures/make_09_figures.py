"""Regenerate chapter 9's figures and tables (about 11 minutes on 2 cores; --quick: under one):

    python tutorials/figures/make_09_figures.py [--quick] [--only PART] [--seeds 16-47] [--keep]

1. Accuracy against the global batch, 1x .. 16x a base batch of 16 at the same number of epochs,
   with the base lr as it is and with linear scaling + gradual warm-up (Goyal et al.), 3 seeds
   -> 09_batch.json, 09_batch.png, 09_table_batch.md.
2. Decaying the lr against increasing the batch (Smith et al.): the same milestones, 3 seeds,
   test accuracy per epoch and per step -> 09_schedule.json, 09_schedule.png, 09_table_schedule.md.
3. search_long, search_short: the exploration. PBT (and evolution without weight inheritance)
   against random search with the same budget in examples on the digits CNN (`mpiexec -n 4
   python -m algorithms.pbt --search pbt|random|evolution`) for seeds 0-15, at 12 rounds of 40 x 32
   examples per member (the defaults until the protocol below) and at a quarter of that, 6 rounds
   of 20 x 32 (the defaults since). A seed gives every method the same initial draws, so the
   comparison is paired: per seed, a method minus random search, and an exact sign-flip test of
   the mean difference -> 09_search_long.json, 09_lineage.png (seed 0's PBT lineage, long budget),
   09_table_search_long.md; 09_search_short.json, 09_table_search_short.md.
4. confirm, confirm_long: the confirmation under the chapter's protocol (section 3), written down
   before these runs: the defaults (6 x 20 x 32), fresh seeds 16-47, one primary test (PBT minus
   random search in test accuracy, sign-flip p < 0.05 with a positive mean); confirm_long repeats
   the long budget on the same seeds (reported, deciding nothing) -> 09_confirm.json,
   09_table_confirm.md; 09_confirm_long.json, 09_table_confirm_long.md.
   reconfirm: the second protocol: the long budget (the defaults again), fresh seeds 48-79, the
   same primary test with p < 0.025 -> 09_reconfirm.json, 09_table_reconfirm.md.
   power: why 32 seeds: the sign-flip test's power at 16 and 32 pairs if the differences were
   normal with search_short's mean / sd (2,000 simulated experiments each) -> 09_power.json, 09_table_power.md.
Every ± this script writes is the mean ± the half-width of the 95% t interval over the n seeds
(t with n - 1 degrees of freedom times s / sqrt n), as in every chapter.
Every search run passes its budget flags explicitly, so a JSON does not depend on pbt's defaults.
Runs 1 and 2 are serial (one process trains the global batch; chapter 4 shows that p ranks at
batch b are serial SGD at p b up to rounding). Outputs go to tutorials/figures/out; --quick shrinks
every part and writes to /tmp.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "out"                   # what the figure scripts write; the scripts themselves stay in HERE
sys.path.insert(0, str(ROOT))
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")

from mpi4py import MPI  # noqa: E402

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from algorithms import allreduce_sgd  # noqa: E402
from algorithms.core import divergence  # noqa: E402

BASE_BATCH, BASE_LR, MOMENTUM = 16, 0.02, 0.9
METHODS = ("pbt", "random", "evolution")
LONG, SHORT = ["--rounds", "12", "--ready", "40", "--ready-batch", "32"], ["--rounds", "6", "--ready", "20",
                                                                           "--ready-batch", "32"]
QUICK = ["--rounds", "2", "--ready", "5", "--ready-batch", "32"]
SEARCHES = {                        # part: (flags on top of pbt's other defaults, seeds, quick seeds)
    "search_long": (LONG, range(0, 16), (0, 1)),
    "search_short": (SHORT, range(0, 16), (0, 1)),
    "confirm": (SHORT, range(16, 48), (2, 3)),
    "confirm_long": (LONG, range(16, 48), (2, 3)),
    "reconfirm": (LONG, range(48, 80), (4, 5)),
}
KEEP = False                                                  # --keep: reuse runs already in the JSON
SEEDS = None                                                  # --seeds: instead of a part's own seeds


def serial(seed, epochs, **schedule):
    """One serial run (the global batch on one process); its history, or None if it diverged."""
    settings = dict(batch_size=BASE_BATCH, lr=BASE_LR, momentum=MOMENTUM, epochs=epochs, seed=seed, quiet=True)
    settings.update(schedule)
    try:
        return allreduce_sgd.train(MPI.COMM_SELF, allreduce="mpi", **settings)[1]
    except divergence.Diverged:
        return None


# t's 97.5% point for 1..40 degrees of freedom (a 95% two-sided interval)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
         2.040, 2.037, 2.035, 2.032, 2.030, 2.028, 2.026, 2.024, 2.023, 2.021)


def half_width(values):
    """The half-width of the 95% t interval of the mean of ``values`` (0 for one value)."""
    return T_975[len(values) - 2] * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def mean_interval(values):
    """(mean, half-width of its 95% t interval, count) over the finite values."""
    values = [value for value in values if value is not None and math.isfinite(value)]
    if not values:
        return float("nan"), float("nan"), 0
    return statistics.mean(values), half_width(values), len(values)


def batch_sweep(out, quick):
    multiples = (1, 4, 16) if quick else (1, 2, 4, 8, 16)
    seeds, epochs = (0, 1) if quick else (0, 1, 2), 2 if quick else 10
    results = {}
    for multiple in multiples:
        for label, schedule in [("base lr", {}),
                                ("linear scaling + 2-epoch warm-up", dict(lr_scaling="linear",
                                                                          reference_batch=BASE_BATCH,
                                                                          warmup_epochs=2))]:
            key = f"{multiple}x|{label}"
            histories = [serial(seed, epochs, batch_size=BASE_BATCH * multiple, **schedule) for seed in seeds]
            results[key] = [None if h is None else h[-1]["test_accuracy"] for h in histories]
            print(key, results[key], flush=True)
    stored = {"multiples": multiples, "seeds": seeds, "epochs": epochs, "base_batch": BASE_BATCH, "base_lr": BASE_LR,
              "accuracy": results}
    (out / "09_batch.json").write_text(json.dumps(stored))
    return batch_table(out, stored)


def batch_table(out, stored):
    """09_batch.png and the table's rows from 09_batch.json's content."""
    multiples, seeds, epochs, results = stored["multiples"], stored["seeds"], stored["epochs"], stored["accuracy"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(6.5, 4))
    for label in ("base lr", "linear scaling + 2-epoch warm-up"):
        stats = [mean_interval(results[f"{m}x|{label}"]) for m in multiples]
        axis.errorbar([BASE_BATCH * m for m in multiples], [s[0] * 100 for s in stats],
                      yerr=[s[1] * 100 for s in stats], marker="o", capsize=3, label=label)
    axis.set(xscale="log", xlabel="global batch (same epochs)", ylabel="test accuracy (%)",
             title=f"digits CNN, {epochs} epochs, mean ± 95% t interval over {len(seeds)} seeds")
    axis.set_xticks([BASE_BATCH * m for m in multiples], [str(BASE_BATCH * m) for m in multiples])
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "09_batch.png", dpi=110)
    rows = []
    for m in multiples:
        cells = []
        for label in ("base lr", "linear scaling + 2-epoch warm-up"):
            mean, half, count = mean_interval(results[f"{m}x|{label}"])
            cells.append(f"{mean * 100:.1f} ± {half * 100:.1f}%" + ("" if count == len(seeds)
                                                                    else f" ({len(seeds) - count} diverged)"))
        rows.append(f"| {BASE_BATCH * m} ({m}x) | " + " | ".join(cells) + " |")
    return ["| global batch | base lr 0.02 | linear scaling + warm-up |", "| --- | --- | --- |"] + rows


def decay_or_grow(out, quick):
    seeds, epochs = (0, 1) if quick else (0, 1, 2), 4 if quick else 16
    milestones = (2, 3) if quick else (8, 12)
    runs = {}
    for label, schedule in [("decay lr / 4", dict(lr_decay=milestones, decay_factor=4.0)),
                            ("batch x 4", dict(lr_decay=milestones, decay_factor=4.0, batch_schedule=True))]:
        runs[label] = [serial(seed, epochs, lr=0.05, **schedule) for seed in seeds]
        print(label, [h[-1]["test_accuracy"] for h in runs[label]], flush=True)
    stored = {"milestones": milestones, "seeds": seeds, "runs": runs}
    (out / "09_schedule.json").write_text(json.dumps(stored))
    return schedule_table(out, stored)


def schedule_table(out, stored):
    """09_schedule.png and the table's rows from 09_schedule.json's content."""
    milestones, runs = stored["milestones"], stored["runs"]
    epochs = next(iter(runs.values()))[0][-1]["epoch"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (per_epoch, per_step) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    n_train = 1438
    for label, histories in runs.items():
        epochs_axis = [r["epoch"] for r in histories[0]]
        accuracy = [statistics.mean(h[i]["test_accuracy"] for h in histories) * 100 for i in range(len(epochs_axis))]
        steps = [sum(math.ceil(n_train / r["global_batch"]) for r in histories[0][:i + 1])
                 for i in range(len(epochs_axis))]
        per_epoch.plot(epochs_axis, accuracy, marker=".", label=label)
        per_step.plot(steps, accuracy, marker=".", label=label)
    per_epoch.set(xlabel="epoch", ylabel="test accuracy (%), mean of seeds", ylim=(90, 100))
    per_step.set(xlabel="optimizer steps")
    per_epoch.legend()
    figure.suptitle(f"decaying the lr vs increasing the batch at epochs {milestones} (batch 16, lr 0.05)")
    figure.tight_layout()
    figure.savefig(out / "09_schedule.png", dpi=110)
    rows = []
    for label, histories in runs.items():
        mean, half, _ = mean_interval([h[-1]["test_accuracy"] for h in histories])
        steps = sum(math.ceil(n_train / r["global_batch"]) for r in histories[0])
        rows.append(f"| {label} at epochs {','.join(map(str, milestones))} | {mean * 100:.1f} ± {half * 100:.1f}% | "
                    f"{steps} |")
    return [f"| schedule ({epochs} epochs) | test accuracy | optimizer steps |", "| --- | --- | --- |"] + rows


def search(out, quick, name):
    """The three searches for SEARCHES[name]'s seeds and flags -> 09_<name>.json; the table's rows."""
    extra, seeds, quick_seeds = SEARCHES[name]
    seeds = tuple(SEEDS or (quick_seeds if quick else seeds))
    extra = QUICK if quick else extra
    kept = out / f"09_{name}.json"
    results = json.loads(kept.read_text()) if KEEP and kept.exists() else {}
    for method in METHODS:
        for seed in seeds:
            if f"{method}|{seed}" in results:                 # --keep: a run is the same bits again
                continue
            scratch = Path("/tmp")                        # per-run files; 09_<name>.json collects them
            log, lineage = scratch / f"09_{name}_{method}_{seed}.jsonl", scratch / f"09_{name}_{method}_{seed}_lin.json"
            command = [MPIEXEC, "-n", "4", sys.executable, "-m", "algorithms.pbt", "--search", method,
                       "--seed", str(seed), "--quiet", "--log", str(log), "--lineage", str(lineage), *extra]
            print("$", " ".join(command[3:]), flush=True)
            subprocess.run(command, cwd=ROOT, env=ENV, check=True)
            records = [json.loads(line) for line in log.read_text().splitlines()]
            results[f"{method}|{seed}"] = {"final": records[-1], "rounds": records[:-1],
                                           "lineage": json.loads(lineage.read_text())}
    (out / f"09_{name}.json").write_text(json.dumps(results))
    if name == "search_long":
        plot_lineage(results[f"pbt|{seeds[0]}"]["lineage"], out / "09_lineage.png")
    return search_table(results, seeds)


def sign_flip_p(differences):
    """Two-sided p of the paired differences' mean under the null "no difference": the share of the
    2^n sign flips whose |sum| is at least the observed one (exact). The flips of the first half
    and of the second half are enumerated apart (2^(n/2) sums each) and the pairs whose total
    reaches the threshold are counted by binary search in the sorted second half, so 32 seeds
    take 2 x 65,536 sums, not 4 x 10^9."""
    import numpy

    def sums(values):                                   # every signed sum of ``values``
        total = numpy.zeros(1)
        for value in values:
            total = numpy.concatenate([total + value, total - value])
        return total

    n, observed = len(differences), abs(sum(differences))
    threshold = observed - 1e-12                        # rounding: the observed flip itself counts
    if threshold <= 0:
        return 1.0
    first, second = sums(differences[:n // 2]), numpy.sort(sums(differences[n // 2:]))
    high = len(second) - numpy.searchsorted(second, threshold - first, side="left")   # total >= threshold
    low = numpy.searchsorted(second, -threshold - first, side="right")               # total <= -threshold
    return int((high + low).sum()) / 2 ** n


def sign_flip_p_by_enumeration(differences):
    """The same p by visiting all 2^n flips one by one (the oracle for small n)."""
    n, observed = len(differences), abs(sum(differences))
    extreme = sum(1 for signs in range(2 ** n)
                  if abs(sum(d if signs >> i & 1 else -d for i, d in enumerate(differences))) >= observed - 1e-12)
    return extreme / 2 ** n


def p_value(p):
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def chosen_held_out_loss(result):
    """The held-out loss of the member chosen at the last ranking (the best finite score)."""
    return -max(entry["score"] for entry in result["lineage"]["members"][-1] if math.isfinite(entry["score"]))


def seed_text(seeds):
    """'16-47' for a run of consecutive seeds, else '0, 3, 5'."""
    seeds = list(seeds)
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def search_table(results, seeds):
    """Rows of a search table (09_table_<part>.md) from its JSON (09_<part>.json): per method the
    chosen member's test accuracy and loss (mean ± 95% t interval over seeds, and each seed), the examples
    every member read and the wall time; then the paired differences, each method - random search."""
    rows, finals = [], {}
    methods = [method for method in METHODS if f"{method}|{seeds[0]}" in results]
    for method in methods:
        runs = [results[f"{method}|{seed}"] for seed in seeds]
        finals[method] = [dict(r["final"], held_out_loss=chosen_held_out_loss(r)) for r in runs]
        accuracy = mean_interval([r["final"]["test_accuracy"] for r in runs])
        loss = mean_interval([r["final"]["test_loss"] for r in runs])
        each = ", ".join(f"{r['final']['test_accuracy'] * 100:.1f}" for r in runs)
        held_out = mean_interval([chosen_held_out_loss(r) for r in runs])
        population = mean_interval([statistics.mean(entry["accuracy"] for entry in r["lineage"]["members"][-1])
                              for r in runs])
        seconds = statistics.mean(r["final"]["seconds"] for r in runs)
        examples = statistics.mean(sum(entry.get("examples", entry["batch_size"] * r["lineage"]["ready"])
                                       for row in r["lineage"]["members"] for entry in row) for r in runs)
        rows.append(f"| {method} | {accuracy[0] * 100:.1f} ± {accuracy[1] * 100:.1f}% ({each}) | "
                    f"{loss[0]:.3f} ± {loss[1]:.3f} | {held_out[0]:.3f} ± {held_out[1]:.3f} | "
                    f"{population[0] * 100:.1f} ± {population[1] * 100:.1f}% | "
                    f"{examples / 1000:.1f} k | {seconds:.0f} s |")
    for method, key, name, scale, unit in [
            (method, key, name, scale, unit) for method in methods if method != "random"
            for key, name, scale, unit in [("test_accuracy", "test accuracy", 100, " points"),
                                           ("test_loss", "test loss", 1, ""),
                                           ("held_out_loss", "held-out loss", 1, "")]]:
        differences = [p[key] - r[key] for p, r in zip(finals[method], finals["random"])]
        mean, half, _ = mean_interval(differences)
        wins = sum(d > 0 if key == "test_accuracy" else d < 0 for d in differences)
        ties = sum(d == 0 for d in differences)
        rows.append(f"| {method} - random, {name} | {mean * scale:+.{1 if scale == 100 else 3}f} ± "
                    f"{half * scale:.{1 if scale == 100 else 3}f}{unit}; {method} better in {wins}, tied in {ties} of "
                    f"{len(differences)} seeds | sign-flip p {p_value(sign_flip_p(differences))} | | | | |")
    lineage = results[f"pbt|{seeds[0]}"]["lineage"]
    budget = lineage.get("ready_batch", 0) * lineage["ready"] * lineage["rounds"]
    return [f"| search ({lineage['population']} members x {budget} examples) | test accuracy of the chosen member "
            f"(seeds {seed_text(seeds)}) | test loss | held-out loss (what ranks the members) | "
            "held-out accuracy, mean of all members | examples read, all members | wall time |",
            "| --- | --- | --- | --- | --- | --- | --- |"] + rows


def plot_lineage(lineage, path):
    """Members (rows) over rounds (columns); an arrow where a member copied another; colour = lr."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(8, 3.5))
    members = lineage["members"]
    lrs = [entry["lr"] for row in members for entry in row]
    low, high = math.log10(min(lrs)), math.log10(max(lrs))
    colour = plt.get_cmap("viridis")
    for row in members:
        for entry in row:
            shade = (math.log10(entry["lr"]) - low) / max(high - low, 1e-12)
            marker = "x" if not math.isfinite(entry["score"]) else "o"
            axis.scatter(entry["round"], entry["member"], color=colour(shade), marker=marker, s=40, zorder=3)
            if entry["parent"] != entry["member"]:
                axis.annotate("", xy=(entry["round"] + 0.9, entry["member"]), xytext=(entry["round"], entry["parent"]),
                              arrowprops=dict(arrowstyle="->", color="tab:red", lw=1))
    axis.set(xlabel="round (--ready x --ready-batch examples per member)", ylabel="member",
             yticks=range(lineage["population"]),
             xticks=range(1, len(members) + 1), title="PBT lineage: arrow = exploit (copy, then perturb)")
    figure.colorbar(plt.cm.ScalarMappable(cmap=colour, norm=plt.Normalize(low, high)), ax=axis, label="log10 lr")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def power(out, quick, experiments=2000, pairs=(16, 32)):
    """The chance that the protocol's test (sign-flip p < 0.05, positive mean) finds an effect of
    search_short's size (its PBT - random test-accuracy differences' mean / sd) with n pairs, the
    differences drawn normal: ``experiments`` simulated experiments per n, Generator(0)."""
    import numpy
    results = json.loads((OUT / "09_search_short.json").read_text())
    seeds = sorted({int(key.split("|")[1]) for key in results})
    differences = [results[f"pbt|{s}"]["final"]["test_accuracy"] - results[f"random|{s}"]["final"]["test_accuracy"]
                   for s in seeds]
    effect = statistics.mean(differences) / statistics.stdev(differences)
    rng, experiments = numpy.random.default_rng(0), 100 if quick else experiments
    found = {}
    for n in pairs:
        draws = rng.normal(effect, 1.0, size=(experiments, n))
        found[n] = sum(sign_flip_p(list(row)) < 0.05 and row.mean() > 0 for row in draws) / experiments
    (out / "09_power.json").write_text(json.dumps({"effect": effect, "experiments": experiments,
                                                   "power": {str(n): value for n, value in found.items()}}))
    return [f"| pairs | power at mean / sd {effect:.2f} ({experiments} experiments) |", "| --- | --- |"] + [
        f"| {n} | {value * 100:.0f}% |" for n, value in found.items()]


def seed_list(text):
    """'16-47' or '16,17,20' -> a tuple of seeds."""
    seeds = []
    for piece in text.split(","):
        low, _, high = piece.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return tuple(seeds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings, output under /tmp/make_09_quick unless "
                                                              "--out is given")
    parser.add_argument("--out", help="output folder (default: tutorials/figures/out, or /tmp/make_09_quick with "
                                      "--quick)")
    parser.add_argument("--keep", action="store_true",
                        help="search parts: reuse the runs already in 09_<part>.json (same seed, same bits)")
    parser.add_argument("--seeds", type=seed_list, default=None,
                        help="search parts: these seeds ('16-47' or '0,3,5') instead of the part's own "
                             "(0-15 for search_long and search_short, 16-47 for confirm and confirm_long)")
    parser.add_argument("--only", choices=["batch", "schedule", *SEARCHES, "power", "lineage", "search-table"],
                        default=None,
                        help="one part; lineage, search-table: redraw 09_lineage.png and write every table "
                             "(and the batch and schedule figures) again from the JSON, without training")
    args = parser.parse_args()
    global KEEP, SEEDS
    KEEP, SEEDS = args.keep, args.seeds
    out = Path(args.out) if args.out else Path("/tmp/make_09_quick") if args.quick else OUT
    out.mkdir(parents=True, exist_ok=True)
    if args.only in ("lineage", "search-table"):        # redrawn from the JSON, no training
        results = json.loads((out / "09_search_long.json").read_text())
        plot_lineage(results["pbt|0"]["lineage"], out / "09_lineage.png")
        for name in SEARCHES:
            if (out / f"09_{name}.json").exists():
                results = json.loads((out / f"09_{name}.json").read_text())
                seeds = sorted({int(key.split("|")[1]) for key in results})
                (out / f"09_table_{name}.md").write_text("\n".join(search_table(results, seeds)) + "\n")
        for name, render in (("batch", batch_table), ("schedule", schedule_table)):
            if (out / f"09_{name}.json").exists():
                rows = render(out, json.loads((out / f"09_{name}.json").read_text()))
                (out / f"09_table_{name}.md").write_text("\n".join(rows) + "\n")
        return
    parts = {"batch": batch_sweep, "schedule": decay_or_grow,
             **{name: (lambda out, quick, name=name: search(out, quick, name)) for name in SEARCHES},
             "power": power}
    for name, part in parts.items():
        if args.only in (None, name):
            table = part(out, args.quick)
            (out / f"09_table_{name}.md").write_text("\n".join(table) + "\n")
            print("\n".join(table), flush=True)


if __name__ == "__main__":
    main()
