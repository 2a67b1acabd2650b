"""Chapter 4 quotes the numbers that tutorials/figures/make_04_figures.py wrote, and no others.

The generated tables (04_table.md, 04_differences.md) must appear in the chapter verbatim. Each
number quoted in the prose is formatted here from the JSON the script wrote, with the rounding the
prose uses, and must appear in the chapter (whitespace-insensitive): the tolerance is half a unit
of the last printed digit (0.05 percentage points for "98.1%", one image for image counts; byte
counts are exact). Rerunning the script changes no accuracy or byte count (same seed, same bits),
so these fail only when the chapter or the script changes without the other.
"""
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "tutorials" / "figures"


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
        return f"{percent(statistics.mean(values))} ± {statistics.stdev(values) * 100:.1f}"

    one_shot = accuracies("sorted, H = end")
    behind = [round((a - b) * test_rows) for a, b in zip(accuracies("sorted, H = 1"), accuracies("sorted, H = 8"))]
    iid = [percent(statistics.mean(accuracies(f"shards, H = {h}"))) for h in ("1", "8", "end")]
    expected = [
        f"one-shot averaging {iid[2]} on iid shards",
        f"{round(statistics.mean(accuracies('shards, H = end')) * test_rows)} of {test_rows} images right "
        "on every seed",
        f"{mean_sd('sorted, H = end')} on sorted ones ({percent(min(one_shot))} to {percent(max(one_shot))}",
        f"{runs['sorted, H = 8']['0'][-1]['bytes']:,} against {runs['sorted, H = 1']['0'][-1]['bytes']:,}",
        f"{mean_sd('sorted, H = 8')} against {mean_sd('sorted, H = 1')} for H = 1",
        f"by {behind[0]}, {behind[1]} and {behind[2]} images of {test_rows}",
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
        return f"{percent(row['mean'])} ± {row['sd'] * 100:.1f}"

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
