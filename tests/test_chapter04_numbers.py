"""Chapter 4 quotes the numbers that tutorials/figures/make_04_figures.py and make_04_overlap.py
wrote, and no others.

The generated tables (04_table.md, 04_differences.md, 04_overlap.md) must appear in the chapter verbatim. Each
number quoted in the prose is formatted here from the JSON the script wrote, with the rounding the
prose uses, and must appear in the chapter (whitespace-insensitive): the tolerance is half a unit
of the last printed digit (0.05 percentage points for "98.1%", one image for image counts; byte
counts are exact). Rerunning the script changes no accuracy or byte count (same seed, same bits),
so these fail only when the chapter or the script changes without the other. Every ± is the
mean ± the half-width of the 95% t interval over the seeds (``half_width``), as the chapter says
once in section 2; a difference is quoted as inside the noise only where its paired interval holds 0.
"""
import json
import statistics
from pathlib import Path

import pytest

from collectives.model.cost import predict
from collectives.nonblocking import overlap_prediction
from tests.helpers import mpiexec

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "tutorials" / "figures" / "out"       # what the figure scripts wrote
T_975 = {2: 4.303, 4: 2.776}           # t's 97.5% point for n - 1 = 2 and 4 degrees of freedom (3 and 5 seeds)


def half_width(values):
    """The half-width of the 95% t interval of the mean of ``values``."""
    return T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def chapter():
    return " ".join((ROOT / "tutorials" / "04_data_parallelism.md").read_text().split())


def percent(value):
    return f"{value * 100:.1f}%"


def final(history):
    return history[-1]["test_accuracy"]


def test_section_6_quotes_the_generated_tables_verbatim():
    text = chapter()
    for name in ("04_table.md", "04_differences.md"):
        table = " ".join((FIGURES / name).read_text().split())
        assert table in text, f"{name} is not in the chapter as generated"


def test_section_2_quotes_the_model_averaging_runs():
    runs = json.loads((FIGURES / "04_noniid.json").read_text())
    test_rows = json.loads((FIGURES / "04_compare.json").read_text())["test_rows"]

    def accuracies(label):
        return [final(history) for history in runs[label].values()]

    def mean_sd(label):
        values = accuracies(label)
        return f"{percent(statistics.mean(values))} ± {half_width(values) * 100:.1f}"

    one_shot = accuracies("sorted, H = end")
    behind = [round((a - b) * test_rows) for a, b in zip(accuracies("sorted, H = 1"), accuracies("sorted, H = 8"))]
    paired = [b - a for a, b in zip(accuracies("sorted, H = 1"), accuracies("sorted, H = 8"))]
    assert abs(statistics.mean(paired)) <= half_width(paired)      # "inside the noise": the paired interval holds 0
    iid = [percent(statistics.mean(accuracies(f"shards, H = {h}"))) for h in ("1", "8", "end")]
    expected = [
        f"one-shot averaging {iid[2]} on iid shards",
        f"{round(statistics.mean(accuracies('shards, H = end')) * test_rows)} of {test_rows} images right "
        "on every seed",
        f"{mean_sd('sorted, H = end')} on sorted ones ({percent(min(one_shot))} to {percent(max(one_shot))}",
        f"{runs['sorted, H = 8']['0'][-1]['bytes']:,} against {runs['sorted, H = 1']['0'][-1]['bytes']:,}",
        f"{mean_sd('sorted, H = 8')} against {mean_sd('sorted, H = 1')} for H = 1",
        f"by {behind[0]}, {behind[1]} and {behind[2]} images of {test_rows}",
        f"the paired interval, {statistics.mean(paired) * 100:+.1f}% ± {half_width(paired) * 100:.1f}, holds 0",
        f"H = 1, 8 and end give {iid[0]}, {iid[1]} and {iid[2]}",
    ]
    assert len(set(accuracies("shards, H = end"))) == 1          # "on every seed"
    text = chapter()
    missing = [phrase for phrase in expected if phrase not in text]
    assert not missing, f"chapter 4 does not quote these as generated: {missing}"


def test_sections_3_to_6_and_e4_5_quote_the_comparison():
    result = json.loads((FIGURES / "04_compare.json").read_text())
    summary, differences, histories = result["summary"], result["differences"], result["histories"]
    four, one = summary["4"], summary["1"]

    def mean_sd(row):
        assert abs(row["interval"] - half_width(row["accuracy"])) < 1e-12
        return f"{percent(row['mean'])} ± {row['interval'] * 100:.1f}"

    ensemble = histories["4"]["ensemble"]
    gains = [(history[-1]["test_accuracy"] - history[-1]["member_accuracy"]) * 100 for history in ensemble.values()]
    spreads = [record["spread"] for history in histories["4"]["gossip_sgd"].values() for record in history]
    at_equal_work = statistics.mean(history[4]["test_accuracy"] for history in ensemble.values())
    assert all(history[4]["epoch"] * result["train_rows"] * 4 == four["allreduce_sgd"]["examples"]
               for history in ensemble.values())                   # epoch 5 = the others' budget
    interval = {p: {name: f"{row['mean'] * 100:+.2f} ± {row['interval'] * 100:.2f}%" for name, row in by.items()}
                for p, by in differences.items()}
    expected = [
        f"one image is {100 / result['test_rows']:.2f}%",
        f"{mean_sd(four['admm_sgd'])} for ADMM and {mean_sd(four['easgd'])} for EASGD at p = 4, "
        f"against {mean_sd(four['allreduce_sgd'])})",
        f"is at most {max(spreads) * 100:.1f}% over five seeds at p = 4, "
        f"{four['gossip_sgd']['final_means']['spread'] * 100:.1f}% at the end",
        f"model reaches {mean_sd(four['gossip_sgd'])}, allreduce SGD's accuracy",
        f"the members score {percent(four['ensemble']['final_means']['member_accuracy'])} on average and the "
        f"ensemble {mean_sd(four['ensemble'])}",
        f"by {min(gains):.1f}% to {max(gains):.1f}%",
        f"the ensemble at p = 4 ({interval['4']['ensemble']}",
        f"model averaging at p = 2 ({interval['2']['model_averaging']}",
        f"ADMM's {differences['4']['admm_sgd']['mean'] * 100:+.2f}% at p = 4".replace("+", ""),
        f"it has processed {four['ensemble']['examples']:,} examples against the others' "
        f"{four['allreduce_sgd']['examples']:,}",
        f"it already stands at {percent(at_equal_work)}",
        f"against allreduce SGD's {percent(four['allreduce_sgd']['mean'])} after 20 epochs",
        f"{mean_sd(one['allreduce_sgd'])} at p = 1 and {mean_sd(four['allreduce_sgd'])} at p = 4",
        f"puts allreduce SGD at {percent(four['allreduce_sgd']['accuracy'][0])} and ADMM at "
        f"{percent(four['admm_sgd']['accuracy'][0])} at p = 4",
    ]
    kilobytes = {name: f"{row['bytes_per_rank'] / 1000:,.0f}" for name, row in four.items()}
    expected.append(f"allreduce SGD sends {kilobytes['allreduce_sgd']} kB, gossip (one peer, every step) "
                    f"{kilobytes['gossip_sgd']}, EASGD (every 4 steps) {kilobytes['easgd']}, ADMM (every 8) "
                    f"{kilobytes['admm_sgd']}, model averaging (every 8) {kilobytes['model_averaging']}, and the "
                    f"ensemble, which exchanges only predictions, {kilobytes['ensemble']}")
    text = chapter()
    missing = [phrase for phrase in expected if phrase not in text]
    assert not missing, f"chapter 4 does not quote these as generated: {missing}"
    # the claims about the intervals: which exclude 0, and that the serial identities are exact at p = 1
    excluding = sorted((p, name) for p, by in differences.items() for name, row in by.items()
                       if abs(row["mean"]) > row["interval"])
    assert excluding == [("2", "model_averaging"), ("4", "ensemble")], excluding
    assert sum(row["interval"] > 0 for by in differences.values() for row in by.values()) == 12
    assert all(differences["1"][name]["paired"] == [0.0] * 5 for name in ("model_averaging", "gossip_sgd", "ensemble"))


def test_section_7_and_e4_6_quote_the_overlap_run():
    """04_overlap.md verbatim, and each number the prose and E4.6 quote, formatted from 04_overlap.json
    with the digits printed (ms to two decimals, us to the unit, the E4.6 inputs as printed)."""
    result = json.loads((FIGURES / "04_overlap.json").read_text())
    text = chapter()
    assert " ".join((FIGURES / "04_overlap.md").read_text().split()) in text, "04_overlap.md is stale in chapter 4"
    steps = {(m["p"], model): m["steps"][model] for m in result["measured"] for model in ("cnn", "mlp")}

    def median_ms(p, model, kind):
        return statistics.median(steps[p, model][kind]) * 1e3
    alpha, beta, gamma = result["alpha_beta_gamma"]
    profiles = result["profiles"]
    gains = {(p, model): overlap_prediction(p, profiles[model]["bucket_bytes"], profiles[model]["backward_after"],
                                            profiles[model]["forward_backward"], alpha, beta, gamma)
             for p in (2, 4) for model in ("cnn", "mlp")}
    gain_us = {key: (without - with_) * 1e6 for key, (without, with_) in gains.items()}
    cnn, mlp = profiles["cnn"], profiles["mlp"]
    butterfly = [predict("butterfly", p, sum(cnn["bucket_bytes"]), alpha, beta, gamma) * 1e6 for p in (2, 4)]
    expected = [
        f"{len(steps[2, 'cnn']['without'])} repeats alternating without and with",
        f"median {median_ms(2, 'cnn', 'with'):.2f} ms against {median_ms(2, 'cnn', 'without'):.2f} ms",
        f"at p = 4, {median_ms(4, 'cnn', 'with'):.2f} against {median_ms(4, 'cnn', 'without'):.2f} ms",
        f"{median_ms(2, 'mlp', 'with'):.2f} against {median_ms(2, 'mlp', 'without'):.2f} ms",
        f"predicts a gain of {gain_us[2, 'cnn']:.0f} to {gain_us[4, 'cnn']:.0f} us on the CNN's "
        f"{cnn['forward_backward'] * 1e3:.1f} ms of computation "
        f"({gain_us[2, 'cnn'] / cnn['forward_backward'] / 1e4:.1f} to "
        f"{gain_us[4, 'cnn'] / cnn['forward_backward'] / 1e4:.1f}%)",
        f"its butterfly takes {butterfly[0]:.0f} us (p = 2) or {butterfly[1]:.0f} us (p = 4)",
        f"predicts {gain_us[2, 'mlp']:.0f} to {gain_us[4, 'mlp']:.0f} us "
        f"({gain_us[2, 'mlp'] / mlp['forward_backward'] / 1e4:.0f} to "
        f"{gain_us[4, 'mlp'] / mlp['forward_backward'] / 1e4:.0f}% "
        f"of its {mlp['forward_backward'] * 1e3:.2f} ms)",
        f"the median step grows by {median_ms(4, 'cnn', 'with') - median_ms(4, 'cnn', 'without'):.1f} ms (CNN) and "
        f"{median_ms(4, 'mlp', 'with') - median_ms(4, 'mlp', 'without'):.1f} ms (MLP)",
        f"alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.3f} ns/B, gamma = {gamma * 1e9:.3f} ns/B, and the "
        "butterfly",
        f"hold {cnn['bucket_bytes'][0]}, {cnn['bucket_bytes'][1]} and {cnn['bucket_bytes'][2]} bytes and are ready "
        f"{cnn['backward_after'][0] * 1e6:.0f}, {cnn['backward_after'][1] * 1e6:.0f} and "
        f"{cnn['backward_after'][2] * 1e6:.1f} us before the end of its {cnn['forward_backward'] * 1e3:.2f} ms",
        f"hold {mlp['bucket_bytes'][0]} and {mlp['bucket_bytes'][1]} bytes, ready {mlp['backward_after'][0] * 1e6:.1f} "
        f"and {mlp['backward_after'][1] * 1e6:.1f} us before the end of {mlp['forward_backward'] * 1e3:.3f} ms",
        f"the model's gain is {gain_us[2, 'cnn']:.0f} to {gain_us[4, 'cnn']:.0f} us on the CNN's "
        f"{cnn['forward_backward'] * 1e3:.1f} ms",
    ]
    missing = [phrase for phrase in expected if phrase not in text]
    assert not missing, f"chapter 4 does not quote these as generated: {missing}"
    # "no row is faster with --buckets" (medians), and the whole CNN sum is hidden in the model
    assert all(median_ms(p, model, "with") >= median_ms(p, model, "without") for p in (2, 4)
               for model in ("cnn", "mlp"))
    assert all(abs(gain_us[p, "cnn"] - b) < 0.5 for p, b in zip((2, 4), butterfly))


def test_the_summary_quotes_the_sections_above():
    result = json.loads((FIGURES / "04_compare.json").read_text())
    four, differences = result["summary"]["4"], result["differences"]["4"]
    runs = json.loads((FIGURES / "04_noniid.json").read_text())

    def mean_sd(label):
        values = [history[-1]["test_accuracy"] for history in runs[label].values()]
        return f"{percent(statistics.mean(values))} ± {half_width(values) * 100:.1f}"
    iid = [percent(statistics.mean(h[-1]["test_accuracy"] for h in runs[f"shards, H = {h}"].values()))
           for h in ("1", "8", "end")]
    summary = chapter()[chapter().index("## Summary"):chapter().index("## Exercises")]
    expected = [f"H = 1, 8 and end give {iid[0]}, {iid[1]} and {iid[2]}",
                f"one-shot averaging falls to {mean_sd('sorted, H = end')}",
                f"recovers {mean_sd('sorted, H = 8')} with 8 times fewer bytes",
                f"ahead at p = 4 ({differences['ensemble']['mean'] * 100:+.2f} ± "
                f"{differences['ensemble']['interval'] * 100:.2f}%)",
                f"allreduce SGD sends {four['allreduce_sgd']['bytes_per_rank'] / 1000:,.0f} kB per rank, model "
                "averaging "
                f"(every 8) {four['model_averaging']['bytes_per_rank'] / 1000:,.0f} kB"]
    missing = [phrase for phrase in expected if phrase not in summary]
    assert not missing, f"chapter 4's summary does not quote these as generated: {missing}"
    assert four["ensemble"]["examples"] == 4 * four["allreduce_sgd"]["examples"]        # "four times the examples"


@pytest.mark.needs("1.1", "1.2", "1.3", "3.6", "3.7", "4.1")
def test_make_04_overlap_quick_runs(tmp_path):
    """The overlap script's quick mode (one short repeat on 2 ranks), so that it does not rot."""
    done = mpiexec(2, "tutorials/figures/make_04_overlap.py", "--quick", "--out", str(tmp_path / "out"), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "04_overlap.json").read_text())
    assert [m["p"] for m in result["measured"]] == [2] and result["alpha_beta_gamma"][0] > 0
    assert set(result["profiles"]) == {"cnn", "mlp"} and (tmp_path / "out" / "04_overlap.md").stat().st_size > 0


def test_the_ddp_comparison_quotes_its_benchmark():
    """Section 7's comparison with PyTorch DDP against tutorials/figures/out/04_ddp.json (python -m
    algorithms.bench), and its table verbatim."""
    rows = {(row["model"], row["batch"]): row for row in json.loads((FIGURES / "04_ddp.json").read_text())}
    text = chapter()
    assert " ".join((FIGURES / "04_ddp.md").read_text().split()) in text, "chapter 4's copy of 04_ddp.md is stale"
    mlp = [rows[("mlp", batch)][f"{side}_ratio"] for batch in (32, 128) for side in ("ring", "mpi")]
    assert f"minidl's step takes {min(mlp):.2f}-{max(mlp):.2f}x DDP's time" in text, mlp
    assert all(row["blas"] == "native" for row in rows.values()) and "`--blas native --markdown" in text
    large = rows[("lenet5", 128)]
    assert all(row["met"] for row in rows.values()), "the prose says every row is under DDP"
    low, high = large["ring_ratio_range"]
    mpi_high = large["mpi_ratio_range"][1]
    flat = " ".join(text.split())
    assert (f"a median of {large['ring_ratio']:.2f}x, runs from {low:.2f} to {high:.2f} (MPI's Allreduce "
            f"{large['mpi_ratio']:.2f}x, up to {mpi_high:.2f})") in flat
    assert high > 0.95, "the prose calls batch 128 even with DDP within the runs' spread"
    split = large["ring_phases"]
    assert (f"of minidl's {large['ring_ms']:.3g} ms, forward takes {split['forward']:.3g} ms and backward "
            f"{split['backward']:.3g}, the allreduce {split['allreduce']:.3g} and the update "
            f"{split['update']:.2g}") in flat
