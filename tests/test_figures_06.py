"""Chapter 6 quotes the numbers tutorials/figures/make_06_figures.py wrote (06_measurements.json,
06_table.md, 06_replicas.json). Its quick mode runs in the chapter's own block (tests/test_tutorials.py).

Tolerance: each number as the chapter prints it (the tables to the digits of 06_table.md, kB to the
unit, load averages to 0.1); the words "the same bubble within 0.015" and "0.01 to 0.05 above it"
are checked on the measured values themselves.
"""
import json
from pathlib import Path

from tests.quoting import assert_quoted

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "tutorials" / "figures" / "out"       # what the figure scripts wrote


def chapter():
    return " ".join((ROOT / "tutorials" / "06_model_and_pipeline_parallelism.md").read_text().split())


def test_the_tables_are_the_generated_ones():
    text = chapter()
    for table in (FIGURES / "06_table.md").read_text().strip().split("\n\n"):
        assert " ".join(table.split()) in text, f"chapter 6's copy of a 06_table.md table is stale:\n{table[:200]}"


def test_sections_2_and_4_quote_the_measurements():
    m = json.loads((FIGURES / "06_measurements.json").read_text())
    P, bubble, memory = m["P"], m["bubble"], m["memory"]
    gaps = [abs(bubble["gpipe"][k] - bubble["1f1b"][k]) for k in bubble["gpipe"]]
    above = [bubble[kind][k] - (P - 1) / (int(k) + P - 1) for kind in bubble for k in bubble[kind]]
    assert max(gaps) <= 0.015                                   # "the same bubble, within 0.015"
    assert round(min(above), 2) >= 0.01 and max(above) <= 0.05  # "0.01 to 0.05 above it"
    kb = [peak / 1000 for peak in memory["gpipe"]["peak_bytes"]], [peak / 1000 for peak in memory["1f1b"]["peak_bytes"]]
    rows = memory["rows"] // memory["m"]                        # 32 rows a micro-batch
    micro_batch = rows * 64 * 8 + 2 * rows * 256 * 8            # its input and two 256-wide outputs, float64
    n = m["bytes"]["8"]["data"]["parameters"]
    quoted = [f"On stage 0 the difference, {round(kb[0][0]) - round(kb[1][0])} kB, is about the "
              f"{memory['gpipe']['held'][0] - memory['1f1b']['held'][0]} micro-batches 1F1B does not hold",
              f"{rows} x 64 input and two {rows} x 256 outputs, {micro_batch / 1000:.0f} kB in float64",
              f"256 x 256 layer alone is {256 * 256 * 8 / 1000:.0f} kB",
              f"load average of {m['load_average'][0]:.1f} over the last minute and {m['load_average'][1]:.1f} "
              f"over the last five",
              f"n = {n} float32 parameters) on 4 ranks",
              f"below a batch of about {2 * (P - 1) * n * 4 // ((P - 1) * (128 + 64 + 10 + 128 + 64) * 4)} here"]
    assert_quoted(quoted, chapter(), "chapter 6")


def test_section_5_quotes_the_replica_runs():
    r = json.loads((FIGURES / "06_replicas.json").read_text())
    replicas = r["replicas"]
    text = chapter()
    for k, record in replicas.items():
        row = (f"| {k} | {', '.join(f'{a:.4f}' for a in record['accuracy'])} | "
               f"{', '.join(map(str, record['server_bytes_per_step']))} | "
               f"{', '.join(map(str, record['replica_bytes_per_step']))} | "
               f"{', '.join(format(s, '.2f') for s in record['seconds'])} |")
        assert row in text, f"chapter 6's replica row for k = {k} is not 06_replicas.json's: {row}"
    assert f"{r['epochs']} epochs" in text
    one, two, three = (replicas[k] for k in ("1", "2", "3"))
    assert one["server_bytes_per_step"] == [2 * 6090 * 4] and two["server_bytes_per_step"] == [2 * 3045 * 4] * 2
    assert len({tuple(record["accuracy"]) for record in replicas.values()}) == 1   # "the same for every k"
    assert min(two["seconds"]) > max(one["seconds"])                             # k = 2 slower on every seed
    assert min(three["seconds"]) <= max(two["seconds"])                          # k = 3 vs 2: ranges overlap
    assert f"{389 * 32 * 4} bytes for a batch of 32 and {two['replica_bytes_per_step'][0]} on average" in text


def test_section_4_predicts_with_chapter_3s_fit():
    """The alpha-beta table uses chapter 3's ping-pong fit (its first p = 2 bench launch), and says which."""
    runs = json.loads((FIGURES / "03_bench_p2.json").read_text())
    first = runs[0][0] if isinstance(runs[0], list) else runs[0]
    alpha, beta = json.loads((FIGURES / "06_measurements.json").read_text())["alpha_beta"]
    assert (alpha, beta) == (first["alpha"], first["beta"])
    assert f"(alpha = {alpha * 1e6:.2f} us, beta = {beta * 1e9:.4f} ns per byte" in chapter()
