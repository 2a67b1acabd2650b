"""Chapter 11 quotes the numbers that tutorials/figures/make_11_figures.py wrote, and no others.

The generated tables (11_tables.md: the memory accounts of LeNet-5 and the MLP at p = 2, and the
training runs) must appear in the chapter verbatim. Each number quoted in the prose is formatted
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
    blocks = re.findall(r"(<!-- [^>]+ -->\n(?:\|.*\n)+)", (FIGURES / "11_tables.md").read_text())
    assert len(blocks) == 3, "11_tables.md should hold the two memory tables and the runs"
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
    assert abs(measured_total / total - 1) <= 0.002, "the prose says the measured row agrees within 0.2%"
    quoted(f"within 0.2% ({kib(measured_total)} KiB)")
    mlp = row("mlp", "data parallel")["predicted"]
    quoted(f"(64-128-64-10: {mlp['params'] // 4:,} parameters)",
           f"(weights, gradient, momentum: {kib(mlp['params'] + mlp['grads'] + mlp['optimizer'])} KiB)")
    gpipe = row("mlp", "pipeline GPipe")
    quoted(f"{kib(gpipe['measured']['activations'])} measured against "
           f"{kib(gpipe['predicted']['activations'])} predicted")


def test_sections_3_to_7_quote_the_accounts():
    lenet_dp, mlp_dp = row("lenet5", "data parallel")["predicted"], row("mlp", "data parallel")["predicted"]
    zero3 = row("lenet5", "ZeRO-3")["predicted"]
    quoted(f"({kib(zero3['comm'])} KiB for LeNet-5")
    sweep = load("11_memory_vs_p.json")["mlp"]["ZeRO-3"]
    quoted(f"stage 3 halves the states at p = 2 ({kib(sweep['2']['states'])} against {kib(sweep['1']['states'])} KiB)",
           f"at p = 64 leaves {kib(sweep['64']['states'])} KiB",
           f"the total moves from {kib(sum(lenet_dp.values()))} to {kib(sum(zero3.values()))} KiB at p = 2")
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
    for method in ("allreduce SGD --recompute", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
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
    spatial, base = runs_of("spatial", "cnn"), runs_of("allreduce SGD", "cnn")
    differences = [spatial[seed]["test_accuracy"] - base[seed]["test_accuracy"] for seed in spatial]
    mean = statistics.mean(differences)
    half = T_975[2] * statistics.stdev(differences) / 3 ** 0.5
    assert abs(mean) <= half, "the chapter says the spatial split's difference is inside the noise"
    quoted(f"{mean * 100:+.2f} ± {half * 100:.2f}% from allreduce SGD on the small CNN")
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
        expected = {"ZeRO-1": 1, "ZeRO-2": 1, "ZeRO-3": 12}.get(record["method"], 0) * gather
        assert extra == expected, f"{record['method']}: {extra} bytes beyond the formula, the chapter says {expected}"
    zero1 = runs_of("ZeRO-1", "mlp")[0]
    quoted(f"{gather} bytes over the run's {zero1['steps']} steps, the "
           f"{zero1['bytes_per_step'] - zero1['predicted_bytes_per_step']:.0f} a step above the formula",
           f"12 gathers of {gather} bytes in all (hence its {runs_of('ZeRO-3', 'mlp')[0]['messages_per_step']:.1f} "
           f"messages a step)")
