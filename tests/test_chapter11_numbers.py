"""Chapter 11 quotes the numbers that tutorials/figures/make_11_figures.py wrote, and no others.

The generated tables (11_tables.md: the memory accounts of LeNet-5 and the MLP at p = 2, and the
training runs; 11_zero_tables.md: ZeRO's Figure 1 on the wide MLP, the locally connected split)
must appear in the chapter verbatim. Each number quoted in the prose is formatted
here from the JSON the script wrote (11_memory_<model>.json: ``python -m algorithms.memory``'s own
JSON; 11_memory_vs_p.json; 11_runs.json), with the rounding the prose uses, and must appear in the
chapter (whitespace-insensitive). Predicted bytes and the runs' accuracies and bytes do not change
when the script is rerun (formulas; same seed, same bits); the measured bytes (tracemalloc) move by
a few tenths of a KiB, so after a rerun the chapter's tables and measured numbers are pasted again.
Every ± is the mean ± the half-width of the 95% t interval over the 3 seeds.
"""
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "tutorials" / "figures" / "out"
T_975 = {2: 4.303}                 # t's 97.5% point for 2 degrees of freedom (3 seeds)


def chapter():
    return " ".join((ROOT / "tutorials" / "11_memory.md").read_text().split())


def load(name):
    return json.loads((FIGURES / name).read_text())


def row(model, method, recompute=False):
    rows = load(f"11_memory_{model}.json")["rows"]
    return next(r for r in rows if r["method"] == method and r["recompute"] == recompute)


def kib(value):
    return f"{value / 1024:.1f}"


def quoted(*texts):
    text = chapter()
    for value in texts:
        assert value in text, f"the chapter does not quote {value!r} (from the script's JSON)"


def test_the_generated_tables_are_in_the_chapter_verbatim():
    text = chapter()
    for name, count in (("11_tables.md", 3), ("11_zero_tables.md", 3)):
        blocks = re.findall(r"(<!-- [^>]+ -->\n(?:\|.*\n)+)", (FIGURES / name).read_text())
        assert len(blocks) == count, f"{name} should hold {count} tables"
        for block in blocks:
            assert " ".join(block.split()) in text, f"{block.splitlines()[0]} is not in the chapter as generated"


def test_section_1_quotes_lenet5_and_the_mlp():
    dp = row("lenet5", "data parallel")
    predicted, measured = dp["predicted"], dp["measured"]
    total = sum(predicted.values())
    quoted(f"{kib(predicted['params'])} KiB of weights ({predicted['params'] // 4:,} float32 values)",
           f"{kib(predicted['activations'])} KiB of activations, {predicted['activations'] / total * 100:.1f}% "
           f"of the rank's {kib(total)} KiB")
    measured_total = sum(measured.values())
    above = measured_total / total - 1
    assert 0 < above <= 0.1, "the prose says the measured row is above the prediction, within the accounts' 10%"
    assert measured["activations"] - predicted["activations"] > 0.9 * (measured_total - total), "nearly all of it"
    quoted(f"The measured row is {above * 100:.1f}% above it ({kib(measured_total)} KiB), nearly all of that in the "
           f"activations ({kib(measured['activations'])} KiB measured)")
    n = predicted["params"] // 4
    assert predicted["extra"] == (-(-n // 2) + n) * 4, "the ring's block and lr * grad"
    quoted(f"Its extra, {kib(predicted['extra'])} KiB, is the ring's receive block ({kib(-(-n // 2) * 4)}) and the "
           f"array momentum SGD's update makes and drops, lr * grad ({kib(n * 4)})")
    mlp = row("mlp", "data parallel")["predicted"]
    quoted(f"(64-128-64-10: {mlp['params'] // 4:,} parameters)",
           f"(weights, gradient, momentum: {kib(mlp['params'] + mlp['grads'] + mlp['optimizer'])} KiB)")
    gpipe = row("mlp", "pipeline GPipe")
    quoted(f"{kib(gpipe['measured']['activations'])} measured against "
           f"{kib(gpipe['predicted']['activations'])} predicted")
    tensor = row("mlp", "tensor")["predicted"]
    serial = 2 * mlp["params"]                              # the serial model's flat weights and gradient
    rest = 3 * (mlp["params"] - gpipe["predicted"]["params"])   # the rest of the weights, gradient, momentum
    quoted(f"({kib(serial)} of the MLP's {kib(tensor['extra'])} KiB)",
           f"({kib(rest)} of GPipe's {kib(gpipe['predicted']['extra'])}; the rest is the outputs")
    lenet_peak = row("lenet5", "data parallel")["peak"]
    quoted(f"they put the peak at {kib(lenet_peak)} KiB against the parts' {kib(measured_total)}")


def test_section_3_quotes_figure_1_measured_on_real_ranks():
    """The wide MLP with Adam: the peaks in the paper's order at every p > 1, stage 3's model states
    within 10% of (4 + 4 + K) Psi / p plus the largest layer's weights and gradient, the bytes sent."""
    psi, largest, mib = 5324810, 1049600, 2 ** 20
    tables = {p: {r["method"]: r for r in load(f"11_zero_p{p}.json")["rows"] if not r["recompute"]}
              for p in (1, 2, 4, 8)}
    for p, rows in tables.items():
        peaks = [rows[m]["peak"] for m in ("data parallel", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
        assert p == 1 or peaks[0] > peaks[1] > peaks[2] > peaks[3], f"p = {p}: peaks {peaks}"
        states = sum(rows["ZeRO-3"]["measured"][part] for part in ("params", "grads", "optimizer"))
        assert abs(states - (16 * psi / p + 8 * largest)) <= 0.1 * (16 * psi / p + 8 * largest), f"p = {p}"
        assert all(rows[m]["sent"]["measured"] == rows[m]["sent"]["predicted"] for m in rows), f"p = {p}: sent"
    four = tables[4]
    quoted("at p = 4, " + ", ".join(f"{four[m]['peak'] / mib:.2f}" for m in ("data parallel", "ZeRO-1", "ZeRO-2"))
           + f" and {four['ZeRO-3']['peak'] / mib:.2f} MiB")
    states = sum(four["ZeRO-3"]["measured"][part] for part in ("params", "grads", "optimizer"))
    quoted(f"Stage 3's model states are {states / mib:.2f} MiB measured",
           f"plus the largest unit's weights and gradient, {(16 * psi / 4 + 8 * largest) / mib:.2f} MiB",
           f"({5 * psi * 4 / mib:.1f} MiB for the whole model)",
           f"rank 0 sends {four['ZeRO-1']['sent']['measured'] / mib:.2f} MiB a step at p = 4",
           f"and {four['ZeRO-3']['sent']['measured'] / mib:.2f} MiB for stage 3")
    mlp3, lenet3, lenet_dp = (row(model, method)["predicted"] for model, method in
                              (("mlp", "ZeRO-3"), ("lenet5", "ZeRO-3"), ("lenet5", "data parallel")))
    quoted(f"The MLP's stage 3 at p = 2 holds {kib(mlp3['params'])} KiB of weights",
           f"holds {kib(lenet3['params'])} KiB of weights against data parallelism's {kib(lenet_dp['params'])}",
           f"the total moves from {kib(sum(lenet_dp.values()))} to {kib(sum(lenet3.values()))} KiB")
    layers = (156, 2416, 48120, 10164, 850)           # LeNet-5's layers; at p = 2 its blocks and 400 x 120 whole
    assert lenet3["params"] == (sum(-(-size // 2) for size in layers) + 48120) * 4, "blocks and one layer whole"
    assert abs(48120 / sum(layers) - 0.78) < 0.005, "the prose says the first Linear is 78% of the weights"


def test_section_5_quotes_the_locally_connected_split():
    local = {p: {r["method"]: r for r in load(f"11_local_p{p}.json")["rows"]}["spatial local"] for p in (1, 2)}
    assert local[2]["predicted"]["params"] * 2 == local[1]["predicted"]["params"] + 10 * 4, "half, the biases on 0"
    runs = load("11_local_runs.json")
    assert len(runs) == 3 and all(r["split_accuracy"] == r["serial_accuracy"] for r in runs), "the same test images"
    assert all(r["weights_apart"] < 2e-6 for r in runs), "the prose says within about a millionth"


def test_sections_3_to_7_quote_the_accounts():
    lenet_dp, mlp_dp = row("lenet5", "data parallel")["predicted"], row("mlp", "data parallel")["predicted"]
    quoted(f"For the MLP at p = 2 that is {kib(sum(row('mlp', 'tensor')['predicted'].values()))} KiB against data "
           f"parallelism's {kib(sum(mlp_dp.values()))}",
           f"the convolutions' activations stay ({kib(sum(row('lenet5', 'tensor')['predicted'].values()))} KiB)")
    spatial = row("lenet5", "spatial")
    quoted(f"{kib(spatial['predicted']['activations'])} KiB against data parallelism's {kib(lenet_dp['activations'])}, "
           f"measured {kib(spatial['measured']['activations'])}")
    mlp_tensor, lenet_tensor = ([row(model, "tensor", flag) for flag in (False, True)] for model in ("mlp", "lenet5"))
    more = mlp_tensor[1]["predicted"]["activations"] - mlp_tensor[0]["predicted"]["activations"]
    assert more == 512 * 64 * 4, "the prose says one recomputed block costs the row product once more"
    quoted(f"{kib(mlp_tensor[1]['predicted']['activations'])} KiB of activations against "
           f"{kib(mlp_tensor[0]['predicted']['activations'])} without ({more // 1024} KiB more",
           f"LeNet-5's {kib(lenet_tensor[1]['predicted']['activations'])} against "
           f"{kib(lenet_tensor[0]['predicted']['activations'])} (measured "
           f"{kib(mlp_tensor[1]['measured']['activations'])} and {kib(lenet_tensor[1]['measured']['activations'])})")
    tiles = row("lenet5", "spatial", recompute=True)
    quoted(f"one stage's activations instead of both stages': {kib(tiles['predicted']['activations'])} KiB "
           f"predicted, measured {kib(tiles['measured']['activations'])}")
    recomputed = row("lenet5", "data parallel", recompute=True)
    plain = row("lenet5", "data parallel")
    quoted(f"{kib(recomputed['predicted']['activations'])} KiB with `--recompute` against "
           f"{kib(plain['predicted']['activations'])} without (measured {kib(recomputed['measured']['activations'])} "
           f"and {kib(plain['measured']['activations'])})")
    mlp_recomputed = row("mlp", "data parallel", recompute=True)["predicted"]["activations"]
    assert mlp_recomputed == mlp_dp["activations"], "the prose says recomputation saves nothing on the MLP"
    quoted(f"no saving at all ({kib(mlp_recomputed)} KiB both ways)")
    gpipe, one_f = row("lenet5", "pipeline GPipe"), row("lenet5", "pipeline 1F1B")
    quoted(f"{kib(gpipe['predicted']['activations'])} KiB of activations under GPipe and "
           f"{kib(one_f['predicted']['activations'])} under 1F1B (measured {kib(gpipe['measured']['activations'])} "
           f"and {kib(one_f['measured']['activations'])})",
           f"{kib(row('lenet5', 'pipeline GPipe', True)['predicted']['activations'])} and "
           f"{kib(row('lenet5', 'pipeline 1F1B', True)['predicted']['activations'])} KiB predicted")
    lenet = load("11_memory_vs_p.json")["lenet5"]
    quoted(f"For LeNet-5 at p = 4 that is {kib(lenet['hybrid 2 x p/2']['4']['total'])} KiB per rank",
           f"about the 2-stage pipeline's {kib(lenet['pipeline 1F1B']['2']['total'])}",
           f"a 4-stage 1F1B pipeline on the same 4 ranks would hold {kib(lenet['pipeline 1F1B']['4']['total'])}")


def runs_of(method, model):
    return {r["seed"]: r for r in load("11_runs.json")["runs"] if (r["method"], r["model"]) == (method, model)}


def test_section_8_quotes_the_runs():
    runs = load("11_runs.json")
    assert runs["ranks"] == 2 and runs["global_batch"] == 32
    for method in ("allreduce SGD --recompute", "ZeRO-1", "ZeRO-2", "ZeRO-3", "ZeRO-3 --prefetch"):
        model = "mlp" if method.startswith("ZeRO") else None
        for model in ([model] if model else ["mlp", "cnn"]):
            found = runs_of(method, model)
            assert len(found) == 3 and all(r["same_bits"] and r["same_bits_as"] == "allreduce SGD"
                                           for r in found.values()), \
                f"{method} ({model}): the chapter says the same bits on every seed"
    for method, model in (("tensor --recompute", "mlp"), ("pipeline 1F1B --recompute", "mlp"),
                          ("spatial --recompute", "cnn")):
        found = runs_of(method, model)
        assert len(found) == 3 and all(r["same_bits"] and r["same_bits_as"] == method.split(" --")[0]
                                       for r in found.values()), f"{method}: the chapter says its plain run's bits"
    for method, model, words in (("spatial", "cnn", "from allreduce SGD on the small CNN"),
                                 ("pipeline 1F1B", "mlp", "an interval that holds 0")):
        split, base = runs_of(method, model), runs_of("allreduce SGD", model)
        differences = [split[seed]["test_accuracy"] - base[seed]["test_accuracy"] for seed in split]
        mean = statistics.mean(differences)
        half = T_975[2] * statistics.stdev(differences) / 3 ** 0.5
        assert abs(mean) <= half, f"the chapter says {method}'s difference is inside the noise"
        quoted(f"{mean * 100:+.2f} ± {half * 100:.2f}%{',' if model == 'mlp' else ''} {words}")
    for method, model in (("tensor", "mlp"), ("pipeline GPipe", "mlp"), ("spatial", "cnn")):
        same = runs_of(method, model)
        assert all(same[seed]["test_accuracy"] == runs_of("allreduce SGD", model)[seed]["test_accuracy"]
                   for seed in same), f"the chapter says {method} scores as many test images on every seed"
    zero = {method: runs_of(method, "mlp")[0] for method in ("ZeRO-1", "ZeRO-3")}
    assert zero["ZeRO-1"]["predicted_messages_per_step"] == 12 and zero["ZeRO-3"]["predicted_messages_per_step"] == 18
    assert zero["ZeRO-3"]["predicted_bytes_per_step"] == 1.5 * zero["ZeRO-1"]["predicted_bytes_per_step"]
    again = runs_of("spatial --recompute", "cnn")[0]
    quoted(f"({again['messages_per_step']:.0f} messages, {again['bytes_per_step']:.0f} bytes against "
           f"{runs_of('spatial', 'cnn')[0]['bytes_per_step']:.0f})")
    tensor, dp = runs_of("tensor", "mlp")[0], runs_of("allreduce SGD", "mlp")[0]
    quoted(f"the tensor split sends {tensor['predicted_bytes_per_step']:.0f} bytes a step where allreduce SGD sends "
           f"{dp['predicted_bytes_per_step']:.0f}")
    crossing = dp["predicted_bytes_per_step"] / (2 * 64 * 4)        # 2 (p-1) N o 4 bytes = the allreduce's
    quoted(f"at a batch of {round(crossing, -1):.0f} rows the two would be equal")
    n = 17226                                  # the MLP's parameters, quoted in section 1
    gather = (runs["ranks"] - 1) * n * 4       # one ring allgather of a float32 vector, all ranks together
    for record in runs["runs"]:
        extra = round((record["bytes_per_step"] - record["predicted_bytes_per_step"]) * record["steps"])
        # stage 3: the weights gathered for each of the 10 evaluations and once at the end; the optimizer
        # state of no stage is gathered without --save
        expected = {"ZeRO-3": 11, "ZeRO-3 --prefetch": 11}.get(record["method"], 0) * gather
        assert extra == expected, f"{record['method']}: {extra} bytes beyond the formula, the chapter says {expected}"
    quoted(f"11 gathers of {gather} bytes in all (hence its {runs_of('ZeRO-3', 'mlp')[0]['messages_per_step']:.1f} "
           f"messages a step)")
