"""Chapters 1-2: the numbers in the prose are the numbers the figure script wrote, and the script runs.

tutorials/figures/make_02_figures.py writes tutorials/figures/out/02_numbers.json (and the tables the
chapter includes); each sentence of chapter 2 that quotes a measured number is matched here by a
pattern and compared with that JSON within a stated tolerance (TOLERANCE: the prose rounds to two
or three significant figures). Chapter 1 has no figure and its blocks print their own numbers;
its one measured sentence (serial SGD from a shell: seconds and accuracy) is checked against
tutorials/figures/out/01_serial.json from make_01_figures.py. Chapter 2's float32 errors are checked
against 02_precision.json (make_02_figures.py --only precision), its GEMM shares against the main
suite's breakdown (02_main.json), its batch sweep against 02_sweep.json (--only sweep), and the same sweep
on a second machine in three launches against tuned/02_sweep.json.
Also: ``cost.work_depth`` against hand-computed values.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minidl.conv import cost

ROOT = Path(__file__).resolve().parent.parent
CHAPTER_1 = ROOT / "tutorials" / "01_autograd_and_layers.md"
CHAPTER = ROOT / "tutorials" / "02_convolution.md"
NUMBERS = ROOT / "tutorials" / "figures" / "out" / "02_numbers.json"
TOLERANCE = 0.03             # relative: "1.49x" stands for anything within 3% of the JSON's 1.486


def test_work_depth_matches_hand_counts():
    # im2col, x (1, 2, 4, 4), w (3, 2, 3, 3), no padding: Ho = Wo = 2, 3 * 2 * 9 * 4 = 216 multiplications
    # per pass; forward dot products of C kh kw = 18 terms: 1 + ceil(log2 18) = 6 levels; grad_x over
    # F kh kw = 27: 6 levels; grad_weight over N Ho Wo = 4: 3 levels. D = 6 + max(6, 3) = 12.
    assert cost.work_depth("im2col", (1, 2, 4, 4), (3, 2, 3, 3), 1, 0) == {
        "work": 3 * 432, "depth": 12, "parallelism": 1296 / 12, "work_forward": 432, "depth_forward": 6}
    # Winograd, same shape, one tile: B^T d B depth 2 (two nonzeros per row, +-1), G g G^T depth 6
    # (a multiplication by 1/2 and a sum of 3 per side), A^T M A depth 4; the sum over C = 2 is
    # 1 + 1. Forward 6 + 2 + 4 = 12; grad_x 4 + (1 + 2) + 2 = 9 (sum over F = 3); grad_weight
    # 4 + 1 + 6 = 11 (one tile). D = 12 + 11 = 23.
    wd = cost.work_depth("winograd", (1, 2, 4, 4), (3, 2, 3, 3), 1, 0)
    assert (wd["depth_forward"], wd["depth"]) == (12, 23)
    assert wd["work"] == 2 * cost.cost("winograd", (1, 2, 4, 4), (3, 2, 3, 3), 1, 0)["multiplies_fwd_bwd"]
    # FFT, x (1, 1, 4, 4), w (1, 1, 3, 3): a 4x4 transform, log2 16 = 4 stages of multiply + add = 8
    # levels, twice (forward and inverse) = 16, plus the one-term "sum" over C = 1: 17 per pass.
    wd = cost.work_depth("fft", (1, 1, 4, 4), (1, 1, 3, 3), 1, 0)
    assert (wd["depth_forward"], wd["depth"]) == (17, 34)
    # fully connected, batch 4, 5 -> 3: forward 2 * 60 = 120 operations, dot products of 5 terms
    # (1 + 3 levels); grad_x over 3 (1 + 2), grad_weight over 4 (1 + 2). D = 4 + 3 = 7.
    assert cost.work_depth_linear(4, 5, 3) == {"work": 360, "depth": 7, "parallelism": 360 / 7,
                                               "work_forward": 120, "depth_forward": 4}
    with pytest.raises(ValueError, match="no cost model"):
        cost.work_depth("gemm", (1, 1, 4, 4), (1, 1, 3, 3), 1, 0)


def _near(quoted, value):
    return abs(quoted - value) <= TOLERANCE * abs(value) + 0.006


def assert_quoted(prose, claims, source, flags=0):
    """Each (pattern, values): the prose says it, and each number it quotes is near its value."""
    for pattern, values in claims:
        found = re.search(pattern, prose, flags)
        assert found, f"chapter 2 no longer says /{pattern}/"
        quoted = [float(group) for group in found.groups()]
        assert all(_near(q, v) for q, v in zip(quoted, values)), f"/{pattern}/ says {quoted}, {source} {values}"


def _claims(numbers):
    """(pattern with one number group per value, the values from the JSON) for every quoted number."""
    w = numbers["winograd_speedup"]
    fft = numbers["fft_speedup"]
    channels = [value for case, value in w.items() if case.startswith("channels")]
    narrow = [w[f"channels {c}"] for c in (8, 16, 32)]
    peak = numbers["memory_fwd_bwd_peak_mib"]
    return [
        (r"GEMMs of the 64-channel layer run at ([\d.]+)-([\d.]+) GFLOP/s", numbers["conv_large_gemm_gflops"]),
        (r"whole layer's ([\d.]+) GFLOP/s", [numbers["conv_large_layer_gflops"]]),
        (r"measured gain is ([\d.]+)x at 64 channels and ([\d.]+)x at 128",
         [w["channels 64"], w["channels 128"]]),
        (r"([\d.]+)x on the batch-32 64-channel layer", [w["large"]]),
        (r"FFT is ([\d.]+)x faster at 7x7 and ([\d.]+)x at 11x11", [fft["7"], fft["11"]]),
        (r"from (\d+)x\d+ on, where `auto` switches", [numbers["fft_crossover_kernel"]]),
        (r"on the large layer minidl takes ([\d.]+)x PyTorch's time", [numbers["torch_ratio_large"]]),
        (r"minidl takes ([\d.]+)-([\d.]+)x PyTorch's time on the kernel sweep", numbers["torch_ratio_kernel"]),
        (r"and ([\d.]+)-([\d.]+)x on the channel sweep", numbers["torch_ratio_channels"]),
        (r"fully connected layer takes ([\d.]+)-([\d.]+)x PyTorch's time", numbers["layers_torch_ratio_fc"]),
        (r"im2col convolution takes ([\d.]+)-([\d.]+)x", numbers["layers_torch_ratio_conv"]),
        (r"peaks at ([\d.]+) MiB for im2col and ([\d.]+) MiB for Winograd",
         [numbers["memory_fwd_bwd_peak_mib"]["im2col"], numbers["memory_fwd_bwd_peak_mib"]["winograd"]]),
        (r"im2col needs ([\d.]+) times less memory than Winograd", [peak["winograd"] / peak["im2col"]]),
        (r"layer: (\d+) MiB against (\d+) MiB\)", [peak["im2col"], peak["winograd"]]),
        (r"counts one block's columns, ([\d.]+) MiB", [numbers["memory_cost_mib"]["im2col"]]),
        (r"its total \(([\d.]+) MiB\)", [numbers["memory_cost_mib"]["winograd"]]),
        (r"and ([\d.]+)-([\d.]+)x at 8, 16 and 32 channels", [min(narrow), max(narrow)]),
        (r"channel sweep runs from ([\d.]+)x \(8 channels\) to ([\d.]+)x \(128 channels\)",
         [min(channels), max(channels)]),
        (r"channels 128, where Winograd is ([\d.]+)x faster than im2col", [w["channels 128"]]),
        (r"from ([\d.]+)x \(LeNet's first layer, where PyTorch is slower\) to ([\d.]+)x", numbers["torch_ratio_all"]),
        (r"im2col takes ([\d.]+)-([\d.]+)x PyTorch's time on the CPU", numbers["torch_ratio_all"]),
    ]


def test_chapter_two_quotes_the_numbers_its_script_wrote():
    numbers = json.loads(NUMBERS.read_text())
    prose = " ".join(CHAPTER.read_text().split())          # sentences may wrap across lines
    assert_quoted(prose, _claims(numbers), "02_numbers.json", re.IGNORECASE)
    # the tables the chapter includes are the generated ones, verbatim
    for name in ("02_workdepth.md", "02_gemm.md", "02_memory.md", "02_conv.txt", "02_layers.txt", "02_allocator.md"):
        table = (ROOT / "tutorials" / "figures" / "out" / name).read_text().strip()
        assert " ".join(table.split()) in prose, f"chapter 2's copy of {name} is stale"
    # auto's disagreements with the measured fastest are named in the text, and the summary says
    # "the two shapes of the suite where it does not pick the measured fastest": 64 and 128 channels
    for case in numbers["auto_disagrees"]:
        assert f"`auto` is not the fastest on {case}" in prose, f"chapter 2 does not say where auto loses: {case}"
    assert sorted(numbers["auto_disagrees"]) == ["channels 128", "channels 64"]
    assert "`auto` keeps im2col at 64 and 128 channels, the two shapes of the suite" in prose
    # Winograd's gain over the channel sweep: lowest at 8 channels, highest at 128 (as quoted), below 1
    # up to 32 channels ("slower on narrow layers"), within 5% of 1 at 64 ("even"), above 1 at 128
    w = numbers["winograd_speedup"]
    channels = {case: value for case, value in w.items() if case.startswith("channels")}
    assert min(channels, key=channels.get) == "channels 8" and max(channels, key=channels.get) == "channels 128"
    assert max(w[f"channels {c}"] for c in (8, 16, 32)) < 1 < w["channels 128"] and abs(w["channels 64"] - 1) < 0.05


def test_chapter_two_quotes_the_gemm_breakdown_of_the_main_suite():
    """Section 5's GEMM paragraph and the summary against 02_main.json (the main suite's breakdown):
    the 64-channel layer's GEMMs as a fraction of the square-GEMM rate and of the layer's time."""
    *rows, summary = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_main.json").read_text())
    gemms = [s for s in summary["stages"] if s["layer"] == "conv2d large" and s["stage"] == "GEMM"]
    layer = next(item for item in summary["layers"] if item["layer"] == "conv2d large fwd+bwd")
    fractions = [min(s["gemm_fraction"] for s in gemms), max(s["gemm_fraction"] for s in gemms)]
    share = 100 * layer["gemm_ms"] / layer["measured_ms"]
    flops = layer["measured_ms"] * next(r["gflops"] for r in rows if r["case"] == "conv2d large fwd+bwd") * 1e6
    rate = summary["machine"]["gemm_gflops"]
    lenet = {name: [s["gemm_fraction"] for s in summary["stages"] if s["layer"] == name and s["stage"] == "GEMM"]
             for name in ("lenet conv1", "lenet conv2")}
    prose = " ".join(CHAPTER.read_text().split())
    for pattern, values in [(r"\(([\d.]+) of ([\d.]+) ms; alone they take ([\d.]+)x PyTorch's whole layer\)",
                             [layer["gemm_ms"], layer["measured_ms"], layer["gemm_ms"] / layer["torch_ms"]]),
                            (r"stages add up to ([\d.]+) ms of the measured ([\d.]+)",
                             [layer["sum_of_stages_ms"], layer["measured_ms"]]),
                            (r"operations at (\d+) GFLOP/s, ([\d.]+) times the square-GEMM rate",
                             [flops / layer["torch_ms"] / 1e6, flops / layer["torch_ms"] / 1e6 / rate]),
                            (r"take ([\d.]+) ms timed alone, ([\d.]+)x PyTorch's layer",
                             [layer["gemm_and_im2col_ms"], layer["gemm_and_im2col_ms"] / layer["torch_ms"]]),
                            (r"and the GEMMs alone, ([\d.]+)x, leave no room", [layer["gemm_ms"] / layer["torch_ms"]]),
                            (r"the stages timed alone add up to ([\d.]+) of the rate, the layer as measured reaches "
                             r"(\d\.\d+)",
                             [flops / layer["sum_of_stages_ms"] / 1e6 / rate,
                              flops / layer["measured_ms"] / 1e6 / rate]),
                            (r"runs its GEMMs at ([\d.]+)-([\d.]+) of the rate, its second \(6 channels, a sum over "
                             r"150\) "
                             r"at ([\d.]+)-(\d\.\d+)", [min(lenet["lenet conv1"]), max(lenet["lenet conv1"]),
                                                      min(lenet["lenet conv2"]), max(lenet["lenet conv2"])]),
                            (r"GFLOP/s, ([\d.]+)-([\d.]+) of the square-matrix rate", fractions),
                            (r"its GEMMs run at ([\d.]+)-([\d.]+) of NumPy's square-matrix rate", fractions),
                            (r"Together they take (\d+)% of the layer's time", [share]),
                            (r"square-matrix rate and take (\d+)% of the layer's time", [share])]:
        found = re.search(pattern, prose)
        assert found, f"chapter 2 no longer says /{pattern}/"
        quoted = [float(group) for group in found.groups()]
        assert all(_near(q, v) for q, v in zip(quoted, values)), f"/{pattern}/ says {quoted}, 02_main.json {values}"


def test_chapter_two_quotes_the_main_suites_target_rows():
    """Section 5's targets bullet against 02_main.json's rows (ratios to two decimals, as the bench
    prints them to three), and PyTorch's time for the 64-channel layer across the three suites."""
    rows = {row["case"]: row
            for row in json.loads((ROOT / "tutorials" / "figures" / "out" / "02_main.json").read_text())[:-1]}
    layer, auto = rows["conv2d large fwd+bwd"], rows["conv2d large fwd+bwd (auto)"]
    lenet, mlp = rows["lenet5 train step"], rows["mlp 784-256-256-10 train step"]
    met = [row["met"] for row in rows.values() if row.get("met") is not None]
    prose = " ".join(CHAPTER.read_text().split())
    quoted = (f"In this run the layer takes {layer['ratio']:.2f}x PyTorch's time at {layer['gemm_fraction']:.2f} "
              f"of the GEMM rate, `auto` (im2col here) {auto['ratio']:.2f}x, the LeNet-5 step {lenet['ratio']:.2f}x "
              f"and the MLP step {mlp['ratio']:.2f}x: {'none is met' if not any(met) else 'some are met'}")
    assert quoted in prose, quoted
    # "the MLP's only just" (within 0.9x by less than 0.02) and the layer's GEMM-rate half of its target met
    assert 0.88 <= mlp["ratio"] <= 0.9 and mlp["met"] and not layer["met"] and not auto["met"]
    assert layer["gemm_fraction"] >= 0.80 and "The GEMM-rate target is met, narrowly" in prose
    torch = [layer["torch_ms"]]
    for name, case in (("02_conv.json", "large"), ("02_layers.json", "conv 64->64 32x32")):
        found = json.loads((ROOT / "tutorials" / "figures" / "out" / name).read_text())
        torch += [row["torch_ms"] for row in found if row.get("case") == case and row.get("torch_ms")]
    assert f"({min(torch):.1f}-{max(torch):.1f} ms for this layer in the three suites' runs" in prose


def test_chapter_two_quotes_the_allocator_table():
    """Section 5's allocator sentences against 02_allocator.json (make_02_figures.py --only allocator)."""
    rows = {(row["case"], row["library"]): row for row in
            json.loads((ROOT / "tutorials" / "figures" / "out" / "02_allocator.json").read_text())}
    lenet, conv = rows[("lenet5 train step", "minidl")], rows[("conv2d large fwd+bwd", "torch")]
    ours = rows[("conv2d large fwd+bwd", "minidl")]
    default, kept = "glibc defaults", "minidl's thresholds"
    prose = " ".join(CHAPTER.read_text().split())
    quoted = [f"LeNet-5 step page-faults {lenet[default]['faults_per_step']:.0f} times a step and takes "
              f"{lenet[default]['ms']:.3g} ms ({lenet[kept]['ms']:.3g} ms with minidl's thresholds)",
              f"PyTorch's 64-channel layer {conv[default]['faults_per_step']:.0f} times, {conv[default]['ms']:.3g} ms "
              f"against {conv[kept]['ms']:.3g} ms"]
    missing = [q for q in quoted if q not in prose]
    assert not missing, f"chapter 2 does not quote 02_allocator.json: {missing}"
    assert ours[default]["faults_per_step"] < 50 and ours[kept]["faults_per_step"] < 50   # "does not fault either way"
    assert lenet[kept]["ms"] < lenet[default]["ms"] and conv[kept]["ms"] < conv[default]["ms"]


def test_chapter_two_quotes_the_conv_suites_times():
    """Section 5's bullets and work-depth paragraph against 02_conv.json's times (the ms and the
    growth factors they quote beside the table)."""
    *rows, _ = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_conv.json").read_text())
    ms = {(row["case"], row["algorithm"]): row["minidl_ms"] for row in rows if row["device"] == "cpu"}
    torch = {row["case"]: row["torch_ms"] for row in rows if row["device"] == "cpu" and row.get("torch_ms")}
    kernel = [f"kernel {k}x{k}" for k in (3, 5, 7, 9, 11, 13)]
    ratios = [ms[(case, "im2col")] / torch[case] for case in kernel]
    prose = " ".join(CHAPTER.read_text().split())
    assert_quoted(prose, [
        (r"where Winograd and im2col tie \(([\d.]+) against ([\d.]+) ms\)",
         [ms[("channels 64", "winograd")], ms[("channels 64", "im2col")]]),
        (r"faster than im2col \(([\d.]+) against ([\d.]+) ms\)",
         [ms[("channels 128", "winograd")], ms[("channels 128", "im2col")]]),
        (r"im2col still wins at 5x5 \(([\d.]+) against ([\d.]+) ms\)",
         [ms[("kernel 5x5", "im2col")], ms[("kernel 5x5", "fft")]]),
        (r"([\d.]+)-([\d.]+)x up to 13x13", [min(ratios), max(ratios)]),
        (r"im2col time grows (\d+)x, its work `kh \* kw` (\d+)x, PyTorch's time (\d+)x",
         [ms[("kernel 13x13", "im2col")] / ms[("kernel 3x3", "im2col")], 169 / 9,
          torch["kernel 13x13"] / torch["kernel 3x3"]]),
        (r"PyTorch's own time jumps \(([\d.]+) to (\d+) ms from 13x13 to 15x15",
         [torch["kernel 13x13"], torch["kernel 15x15"]]),
        (r"the table shows direct ([\d.]+)x \(LeNet's conv2\) to ([\d.]+)x \(the 64-channel layer\) slower",
         [ms[("lenet conv2", "direct")] / ms[("lenet conv2", "im2col")],
          ms[("large", "direct")] / ms[("large", "im2col")]]),
        (r"Winograd takes ([\d.]+) ms against ([\d.]+) and FFT (\d+) ms",
         [ms[("large", "winograd")], ms[("large", "im2col")], ms[("large", "fft")]]),
    ], "02_conv.json")
    # "im2col still wins at 5x5"
    assert ms[("kernel 5x5", "im2col")] < ms[("kernel 5x5", "fft")]


def test_chapter_two_quotes_the_layers_suite():
    """Section 6's CPU paragraph against 02_layers.json: the GEMM rates in its header and the layers'
    fractions of NumPy's rate (fc from 0.85 to 0.93, conv from 16 channels' to 128 channels')."""
    *rows, summary = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_layers.json").read_text())
    fc = [row["gemm_fraction"] for row in rows if row["kind"] == "linear" and row["device"] == "cpu"]
    conv = {row["case"]: row["gemm_fraction"] for row in rows if row["kind"] == "conv" and row["device"] == "cpu"}
    assert min(conv, key=conv.get) == "conv 16->16 32x32" and max(conv, key=conv.get) == "conv 128->128 32x32"
    prose = " ".join(CHAPTER.read_text().split())
    assert_quoted(prose, [
        (r"NumPy runs a square GEMM at (\d+) GFLOP/s and this PyTorch build at (\d+) \(the first line\)",
         [summary["machine"]["gemm_gflops"], summary["machine"]["torch_gemm_gflops"]]),
        (r"three GEMMs, at ([\d.]+)-([\d.]+) of NumPy's square rate on minidl's side", [min(fc), max(fc)]),
        (r"its rate grows from ([\d.]+) of NumPy's GEMM rate at 16 channels to ([\d.]+) at 128",
         [min(conv.values()), max(conv.values())]),
    ], "02_layers.json")


def test_chapter_two_quotes_the_batch_sweep():
    """Section 5's batch sweep against 02_sweep.json (make_02_figures.py --only sweep): 02_sweep.md
    verbatim, the ranges the prose and the summary quote (two decimals, as the table prints them),
    "every target is met", and NumPy's GEMM rate with OpenBLAS's own kernel (the sweep's workers,
    --blas native) against the forced one (the conv, layers and main suites' headers)."""
    out = ROOT / "tutorials" / "figures" / "out"
    *rows, summary = json.loads((out / "02_sweep.json").read_text())
    machine = summary["machine"]
    prose = " ".join(CHAPTER.read_text().split())
    table = (out / "02_sweep.md").read_text().strip()
    assert " ".join(table.split()) in prose, "chapter 2's copy of 02_sweep.md is stale"

    def span(case, key, batches=None):
        values = [row[key] for row in rows if row["case"] == case and (batches is None or row["batch"] in batches)]
        return f"{min(values):.2f}-{max(values):.2f}"
    lenet, mlp, conv = "lenet5 train step", "mlp 784-256-256-10 train step", "conv 64->64 32x32"
    targets = {row["case"]: row["target"] for row in rows}
    assert targets == {lenet: "<= 1.2x torch", mlp: "<= 0.9x torch", conv: "<= 1.15x floor"}
    assert sorted({row["batch"] for row in rows}) == [16, 32, 64, 128, 256]           # "batch 16 to 256"
    assert all(row["met"] for row in rows), "the prose says every target is met"
    against_torch = (f"takes {span(conv, 'ratio', (16, 32))}x at batch 16 and 32 and "
                     f"{span(conv, 'ratio', (128, 256))}x at batch 128 and 256")
    assert prose.count(against_torch) == 2, f"section 5 and the summary both say: {against_torch}"
    # --blas native: the sweep's workers ran without the forcing, the other suites with it
    forced = [json.loads((out / name).read_text())[-1]["machine"]
              for name in ("02_conv.json", "02_layers.json", "02_main.json")]
    assert machine["blas"] == "native" and machine["blas_forced"] == {}
    assert all(m["blas_forced"].get("OPENBLAS_CORETYPE") == "Haswell" for m in forced)
    low, high = min(m["gemm_gflops"] for m in forced), max(m["gemm_gflops"] for m in forced)
    torch = [m["torch_gemm_gflops"] for m in forced + [machine]]
    native, main_suite = machine["gemm_gflops"], forced[-1]["gemm_gflops"]
    for phrase in ("every target is met in this run",
                   f"The LeNet-5 step takes {span(lenet, 'ratio')}x PyTorch's time (the target is 1.2x)",
                   f"the MLP step takes {span(mlp, 'ratio')}x (target 0.9x)",
                   f"the 64-channel layer takes {span(conv, 'over_floor')}x its floor (target 1.15x)",
                   f"the LeNet-5 step takes {span(lenet, 'ratio')}x PyTorch's time, the MLP step "
                   f"{span(mlp, 'ratio')}x, "
                   f"and the 64-channel layer {span(conv, 'over_floor')}x its floor",
                   f"its square GEMM runs at {native:.0f} GFLOP/s there, against {low:.0f}-{high:.0f} GFLOP/s with the "
                   f"forced Haswell kernel",
                   f"NumPy's square GEMM runs at {low:.0f}-{high:.0f} GFLOP/s there, about half of the {native:.0f} "
                   f"GFLOP/s of OpenBLAS's own choice",
                   f"its GEMM runs at {min(torch):.0f}-{max(torch):.0f} GFLOP/s either way",
                   f"(`--blas native`, {native:.0f} GFLOP/s instead of {main_suite:.0f})"):
        assert phrase in prose, f"chapter 2 does not quote 02_sweep.json: {phrase}"
    assert 1.7 < machine["gemm_gflops"] / high and machine["gemm_gflops"] / low < 2.1    # "about half"
    # the shape of the curves: LeNet-5's ratio "lowest at batch 16 and 1.03-1.10x from batch 32 on", the
    # MLP's "less as the batch grows from 32 on", the layer "even ran faster than its stages timed alone"
    # at batch 32 (its lowest ratio to the floor) and within 5% of its floor at every batch ("lost in
    # the timing noise"), its time "doubles with the batch", PyTorch's "grows 2.8 times from batch 32 to 64"
    by = {(row["case"], row["batch"]): row for row in rows}
    batches = [16, 32, 64, 128, 256]
    lenet_ratios, mlp_ratios = [by[(lenet, b)]["ratio"] for b in batches], [by[(mlp, b)]["ratio"] for b in batches[1:]]
    assert min(lenet_ratios) == lenet_ratios[0] and mlp_ratios == sorted(mlp_ratios, reverse=True)
    assert f"lowest at batch 16 and {span(lenet, 'ratio', (32, 64, 128, 256))}x from batch 32 on" in prose
    floors = {b: by[(conv, b)]["over_floor"] for b in batches}
    assert min(floors, key=floors.get) == 32 and floors[32] < 1 and all(abs(f - 1) < 0.05 for f in floors.values())
    assert all(1.8 < by[(conv, b)]["minidl_ms"] / by[(conv, a)]["minidl_ms"] < 2.2
               for a, b in zip(batches, batches[1:]))
    torch_32, torch_64 = by[(conv, 32)]["torch_ms"], by[(conv, 64)]["torch_ms"]
    suites = {"02_conv.json": "large", "02_layers.json": "conv 64->64 32x32", "02_main.json": "conv2d large fwd+bwd"}
    forced_rows = [row for name, case in suites.items() for row in json.loads((out / name).read_text())
                   if row.get("case") == case and row.get("algorithm", "im2col") == "im2col" and row.get("torch_ms")]
    ours, theirs = [row["minidl_ms"] for row in forced_rows], [row["torch_ms"] for row in forced_rows]
    assert len(forced_rows) == 3
    for phrase in (f"PyTorch's grows {torch_64 / torch_32:.1f} times from batch 32 to 64 ({torch_32:.3g} to "
                   f"{torch_64:.3g} ms)",
                   f"the layer takes {by[(conv, 32)]['minidl_ms']:.3g} ms here against "
                   f"{min(ours):.3g}-{max(ours):.3g} ms "
                   f"with the forced kernel, while PyTorch's time hardly moves ({torch_32:.3g} ms, "
                   f"{min(theirs):.1f}-{max(theirs):.1f} above)"):
        assert phrase in prose, f"chapter 2 does not quote 02_sweep.json: {phrase}"


def test_chapter_two_quotes_the_tuned_sweep_in_three_launches(tmp_path):
    """Section 5's later run against tuned/02_sweep.json, 02_sweep.txt, 02_tuning.json and 02_tuning.txt
    (make_02_figures.py --only tune --only sweep --out tutorials/figures/out/tuned): each cell of
    02_sweep_launches.md against its row, the table verbatim in the chapter, and every sentence of the
    subsection and the summary that quotes the run (counts, batches, targets, ranges, the launches whose
    rounds do not overlap, GEMM rates, the machine, and what the tuner kept and changed)."""
    tuned = ROOT / "tutorials" / "figures" / "out" / "tuned"
    text = CHAPTER.read_text()
    section = " ".join(text[text.index("### The same sweep after a tuning run"):text.index("## 6. CPU")].split())
    summary_text = " ".join(text[text.index("## Summary"):].split())
    table = (tuned / "02_sweep_launches.md").read_text()
    assert " ".join(table.split()) in section, "chapter 2's copy of tuned/02_sweep_launches.md is stale"
    *rows, summary = json.loads((tuned / "02_sweep.json").read_text())
    machine, tuning_file = summary["machine"], json.loads((tuned / "02_tuning.json").read_text())["minidl"]
    # the sweep ran on this tuning file: its name, when it was written, the settings the workers read
    assert machine["tuning"] == f"tuned: tutorials/figures/out/tuned/02_tuning.json (written {tuning_file['written']})"
    assert machine["settings"] == tuning_file["settings"] and summary["launches"] == 3
    lenet, mlp, conv = "lenet5 train step", "mlp 784-256-256-10 train step", "conv 64->64 32x32"
    by = {}
    for row in rows:
        assert row["device"] == "cpu" and (row["case"], row["batch"], row["launch"]) not in by
        by[(row["case"], row["batch"], row["launch"])] = row
    order = [lenet, mlp, conv]
    pairs = sorted({(case, batch) for case, batch, _ in by}, key=lambda pair: (pair[1], order.index(pair[0])))
    assert len(pairs) == 15 and all((case, batch, k) in by for case, batch in pairs for k in range(3))

    def median(row):
        return row["median_over_floor"] if "median_over_floor" in row else row["median_ratio"]

    def spread(row):
        return row["over_floor_range"] if "median_over_floor" in row else row["ratio_range"]
    # each cell of the table against its own row (not against the script's rendering)
    lines = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(lines) == 15
    for line, (case, batch) in zip(lines, pairs):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[:3] == [case, str(batch), by[(case, batch, 0)]["target"]]
        for k in range(3):
            row = by[(case, batch, k)]
            low, high = spread(row)
            assert cells[3 + k] == f"{median(row):.3f} [{low:.3f}, {high:.3f}] {'yes' if row['met'] else 'NO'}"
            limit = {lenet: 1.0, mlp: 0.8, conv: 1.1}[case]
            assert row["met"] == (median(row) <= limit) and low <= median(row) <= high
        assert cells[6] == f"{sum(by[(case, batch, k)]['met'] for k in range(3))} of 3"
    targets = {case: {row["target"] for row in rows if row["case"] == case} for case in (lenet, mlp, conv)}
    assert targets == {lenet: {"<= 1.0x torch"}, mlp: {"<= 0.8x torch"}, conv: {"<= 1.1x floor"}}
    met = {pair: sum(by[pair + (k,)]["met"] for k in range(3)) for pair in pairs}
    held = [pair for pair in pairs if met[pair] >= 2]
    assert held == [(lenet, 16), (lenet, 32), (lenet, 64)]
    looser = {lenet: 1.2, mlp: 0.9, conv: 1.15}
    held_looser = sum(sum(median(by[pair + (k,)]) <= looser[pair[0]] for k in range(3)) >= 2 for pair in pairs)
    medians = {pair: [median(by[pair + (k,)]) for k in range(3)] for pair in pairs}

    def span(values):
        return f"{min(values):.3f}-{max(values):.3f}"
    # "a launch can move a whole row": the MLP at batch 16, one launch's rounds above both others'
    mlp_16 = medians[(mlp, 16)]
    odd = max(range(3), key=lambda k: mlp_16[k])
    others = [k for k in range(3) if k != odd]
    ranges = [spread(by[(mlp, 16, k)]) for k in range(3)]
    assert all(ranges[odd][0] > ranges[k][1] for k in others)
    lenet_16 = medians[(lenet, 16)]
    # "rows that hold still ... on both sides of their line"
    steady_lenet = medians[(lenet, 32)] + medians[(lenet, 64)]
    layer = [m for (case, _), values in medians.items() if case == conv for m in values]
    assert max(steady_lenet) <= 1.0 and min(medians[(mlp, 256)]) > 0.8
    assert all(met[pair] <= 1 for pair in pairs if pair[0] == conv) and met[(mlp, 256)] <= 1
    assert met[(lenet, 32)] == met[(lenet, 64)] == 3
    # the GEMM rates of the three launches, as the bench printed them, and the run above
    printed = (tuned / "02_sweep.txt").read_text()
    numpy_rates = [float(x) for x in re.findall(r"launch \d of 3: .*?NumPy GEMM ([\d.]+) GFLOP/s", printed)]
    torch_rates = [float(x) for x in re.findall(r"launch \d of 3: .*?PyTorch \S+ GEMM ([\d.]+) GFLOP/s", printed)]
    assert numpy_rates == [round(rate, 1) for rate in machine["gemm_gflops_launches"]] and len(torch_rates) == 3
    old = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_sweep.json").read_text())[-1]["machine"]
    assert all(row["met"] for row in json.loads((ROOT / "tutorials" / "figures" / "out" / "02_sweep.json").read_text())
               if row.get("kind") != "summary")                        # "every row met the looser targets"
    # the tuner: its time, the machine it recorded, what it kept and what it changed
    tune_seconds = re.search(r"minidl.tune: (\d+) s;", (tuned / "02_tuning.txt").read_text()).group(1)
    from minidl import tuning
    from minidl.conv import im2col_blocked as blocked
    from minidl.tune.conv import LENET
    recorded, settings, shipped = tuning_file["machine"], tuning_file["settings"], tuning.Settings()
    assert settings["block_bytes"] == 2 * recorded["l2_bytes"] == 2 << 20
    for name, (c, f, side, k, stride, padding) in LENET.items():      # the shipped rule's layout at batch 64
        x_shape, w_shape = (64, c, side, side), (f, c, k, k)
        blocks = blocked.image_blocks(x_shape, w_shape, stride, padding, 4, settings["block_bytes"])
        rule = blocked.kept_layout(x_shape, w_shape, stride, padding, 4, len(blocks))
        chosen = tuning.layout_for(settings["layouts"], tuning.shape_key(x_shape, w_shape, stride, padding, 4), 64)
        assert chosen == rule == {"conv1": "per image", "conv2": "batch inner"}[name]
    mib = 1 << 20
    phrases = [
        f"A later run on a {recorded['cores']}-core {recorded['cpu']} with {recorded['l2_bytes'] // mib} MiB of L2 "
        f"cache a core (the description this chapter's machine has; here OpenBLAS picked its {recorded['blas_core']} "
        "kernel)",
        "the LeNet-5 step at most 1.0x PyTorch's time, the MLP step 0.8x, and the 64-channel layer 1.10x its floor",
        f"The tuner took {tune_seconds} s (`tuned/02_tuning.txt`)",
        f"It kept the shipped block size ({settings['block_bytes'] // mib} MiB, twice the L2 cache)",
        f"It changed the column budget from {shipped.column_bytes // mib} to {settings['column_bytes'] // mib} MiB and "
        f"`auto`'s thresholds: Winograd from {settings['winograd_min_channels']} channels instead of "
        f"{shipped.winograd_min_channels}, FFT from kernel {settings['fft_min_kernel']} instead of "
        f"{shipped.fft_min_kernel}",
        f"NumPy's GEMM ran at {min(numpy_rates):.0f}-{max(numpy_rates):.0f} GFLOP/s in the three launches and "
        f"PyTorch's at {min(torch_rates):.0f}-{max(torch_rates):.0f} (`tuned/02_sweep.txt`), against "
        f"{old['gemm_gflops']:.0f} and {old['torch_gemm_gflops']:.0f} in the run above",
        f"Here {len(held)} of the 15 rows met their target in at least 2 of the 3 launches: the LeNet-5 step at batch "
        "16, 32 and 64. The LeNet-5 step at batch 128 and 256, the MLP step at every batch and the 64-channel layer "
        "at every batch did not",
        f"On the looser targets of the run above (1.2x, 0.9x, 1.15x) {held_looser} of the 15 rows would have met "
        "theirs in at least 2 launches",
        f"The MLP step's median at batch 16 is {mlp_16[others[0]]:.3f} and {mlp_16[others[1]]:.3f} in launches "
        f"{others[0] + 1} and {others[1] + 1} and {mlp_16[odd]:.3f} in launch {odd + 1}, whose rounds "
        "([{:.3f}, {:.3f}]) do not overlap those of the other two ([{:.3f}, {:.3f}] and [{:.3f}, {:.3f}])".format(
            *ranges[odd], *ranges[others[0]], *ranges[others[1]]),
        f"the LeNet-5 step's median at batch 16 runs from {min(lenet_16):.3f} to {max(lenet_16):.3f} over the "
        "launches",
        f"The LeNet-5 step at batch 32 and 64 stays at {span(steady_lenet)}x PyTorch's time and met its target in "
        f"every launch; the MLP step at batch 256 stays at {span(medians[(mlp, 256)])}x against its 0.8x, and the "
        f"64-channel layer at {span(layer)}x its floor against 1.10x, and neither met its target in more than one "
        "launch"]
    for phrase in phrases:
        assert phrase in section, f"chapter 2's section 5 does not quote tuned/02_sweep.json: {phrase}"
    for phrase in (f"after `python -m minidl.tune` ({tune_seconds} s)",
                   f"met {len(held)} of its 15 rows in at least 2 of the 3 launches: the LeNet-5 step at batch 16, "
                   f"32 and 64 ({held_looser} of 15 on the looser targets)",
                   f"NumPy's GEMM ran at {min(numpy_rates):.0f}-{max(numpy_rates):.0f} GFLOP/s and PyTorch's at "
                   f"{min(torch_rates):.0f}-{max(torch_rates):.0f}",
                   f"one row's median moved from {min(lenet_16):.3f} to {max(lenet_16):.3f} between launches"):
        assert phrase in summary_text, f"chapter 2's summary does not quote tuned/02_sweep.json: {phrase}"
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"chapter 2's later sweep met {len(held)} of its 15 rows in at least 2 of 3 launches" in readme


def test_chapter_two_quotes_the_float32_errors_its_script_measured():
    """Section 4's precision sentences against 02_precision.json (make_02_figures.py --only precision),
    to the two significant figures printed."""
    measured = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_precision.json").read_text())
    worst, ratio = measured["worst"], measured["largest_ratio_to_im2col"]
    prose = " ".join(CHAPTER.read_text().split())

    def e(value):                                  # 1.7e-6, as the chapter prints it
        return f"{value:.1e}".replace("e-0", "e-")
    quoted = [f"on {measured['random_shapes']} random shapes",
              f"worst float32 errors are {e(worst['im2col']['error'])} for im2col, {e(worst['fft']['error'])} for FFT "
              f"and {e(worst['winograd']['error'])} for Winograd (on the 64-channel layer's "
              f"`{worst['winograd']['array']}`)",
              f"Winograd's error is at most {ratio['winograd']:.1f} times im2col's and FFT's at most "
              f"{ratio['fft']:.1f} times"]
    missing = [q for q in quoted if q not in prose]
    assert not missing, f"chapter 2 does not quote 02_precision.json: {missing}"
    assert worst["winograd"]["shape"][0][1] == 64                        # "the 64-channel layer"
    assert max(w["error"] for w in worst.values()) == worst["im2col"]["error"]   # "neither exceeds im2col's"
    assert max(w["error"] for w in worst.values()) < 5e-6                        # "the tests allow 5e-6"


def test_chapter_one_quotes_the_serial_run_its_script_measured():
    measured = json.loads((ROOT / "tutorials" / "figures" / "out" / "01_serial.json").read_text())
    prose = " ".join(CHAPTER_1.read_text().split())
    found = re.search(r"10 epochs: ([\d.]+)-([\d.]+) s of CPU time .* and ([\d.]+)-([\d.]+)% test accuracy", prose)
    assert found, "chapter 1 no longer quotes the serial run"
    low_s, high_s, low_a, high_a = map(float, found.groups())
    assert _near(low_s, measured["cpu_seconds"]["min"]) and _near(high_s, measured["cpu_seconds"]["max"])
    assert _near(low_a, 100 * measured["test_accuracy"]["min"]) and _near(high_a,
                                                                          100 * measured["test_accuracy"]["max"])


@pytest.mark.needs("1.1", "1.2", "1.3", "1.5")
def test_make_01_figures_quick_runs(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess.run([sys.executable, str(ROOT / "tutorials" / "figures" / "make_01_figures.py"), "--quick",
                    "--out", str(tmp_path)], check=True, env=env, cwd=ROOT, capture_output=True, timeout=120)
    measured = json.loads((tmp_path / "01_serial.json").read_text())
    assert [run["seed"] for run in measured["runs"]] == [0] and 0 < measured["test_accuracy"]["mean"] <= 1


@pytest.mark.needs("1.3", "1.4", "2.1", "2.2", "2.3")
def test_make_02_figures_quick_runs(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    subprocess.run([sys.executable, str(ROOT / "tutorials" / "figures" / "make_02_figures.py"), "--quick",
                    "--no-torch", "--repeats", "1", "--out", str(tmp_path)], check=True, env=env, cwd=ROOT,
                   capture_output=True, timeout=300)
    for name in ("02_conv.json", "02_layers.json", "02_main.json", "02_conv.png", "02_layers.png", "02_gemm.md",
                 "02_memory.md", "02_workdepth.md", "02_allocator.md", "02_sweep.md", "02_sweep_launches.md"):
        assert (tmp_path / name).stat().st_size > 0, name
    numbers = json.loads((tmp_path / "02_numbers.json").read_text())
    assert isinstance(numbers["layers_gpu_measured"], bool)
    assert set(numbers["winograd_speedup"]) >= {"large"} and numbers["winograd_multiply_ratio"] > 1
    precision = json.loads((tmp_path / "02_precision.json").read_text())
    assert set(precision["worst"]) == {"im2col", "fft", "winograd"}
    assert all(0 < row["error"] < 5e-6 for row in precision["worst"].values())      # float32 rounding, not 0
    rows = json.loads((tmp_path / "02_workdepth.json").read_text())
    assert {row["algorithm"] for row in rows} == {"direct", "im2col", "fft", "winograd", "GEMM"}


def test_chapter_two_gpu_section_quotes_the_gpu_run():
    """Section 6's GPU half against 02_gpu_numbers.json (make_02_figures.py --only gpu, from the JSON
    that tutorials/figures/gpu_02.sh wrote on a GPU machine), and its three tables verbatim."""
    gpu = json.loads((ROOT / "tutorials" / "figures" / "out" / "02_gpu_numbers.json").read_text())
    prose = " ".join(CHAPTER.read_text().split())
    claims = [
        (r"([\d.]+) GFLOP/s on one CPU core and at ([\d.]+) GFLOP/s through CuPy",
         [gpu["cpu_gemm_gflops"], gpu["cupy_gemm_gflops"]]),
        (r"GPU, (\d+) times faster", [gpu["cupy_gemm_gflops"] / gpu["cpu_gemm_gflops"]]),
        (r"differ between NumPy and CuPy by at most ([\d.e-]+) relative", [gpu["train_loss_max_relative_difference"]]),
        (r"runs it ([\d.]+)x faster than one core at 256x256", [gpu["fc_cpu_over_gpu"][0]]),
        (r"and ([\d.]+)x faster at 4096x4096", [gpu["fc_cpu_over_gpu"][1]]),
        (r"([\d.]+)-([\d.]+)x its time on the GPU", gpu["fc_gpu_torch_ratio"]),
        (r"The convolution gains ([\d.]+)-([\d.]+)x", gpu["conv_cpu_over_gpu"]),
        (r"takes ([\d.]+)-([\d.]+)x the time of PyTorch's \(cuDNN's\)", gpu["conv_gpu_torch_ratio"]),
        (r"The first run gave the convolution only ([\d.]+)-([\d.]+)x", gpu["blocked_conv_cpu_over_gpu"]),
        (r"and minidl ([\d.]+)-([\d.]+)x cuDNN's time", gpu["blocked_conv_gpu_torch_ratio"]),
        (r"the slowest of the four on the GPU \(([\d.]+) ms\) and FFT the fastest \(([\d.]+) ms",
         [gpu["large_gpu_ms"]["im2col (blocks)"], gpu["large_gpu_ms"]["fft"]]),
        (r"as one block it takes ([\d.]+) ms", [gpu["large_gpu_ms"]["im2col"]]),
        (r"\(CPU / GPU ([\d.]+)\)", [gpu["lenet_cpu_over_gpu"]["16"]]),
        (r"up to batch 64 \(([\d.]+)-([\d.]+)\)", [gpu["mlp_cpu_over_gpu"]["16"], gpu["mlp_cpu_over_gpu"]["64"]]),
        (r"From batch 32 \(LeNet-5, ([\d.]+)x\) and 128 \(MLP, ([\d.]+)x\)",
         [gpu["lenet_cpu_over_gpu"]["32"], gpu["mlp_cpu_over_gpu"]["128"]]),
        (r"at batch 256 it is ([\d.]+)x and ([\d.]+)x faster",
         [gpu["lenet_cpu_over_gpu"]["256"], gpu["mlp_cpu_over_gpu"]["256"]]),
        (r"the conv layer ([\d.]+)-([\d.]+)x faster, once", gpu["conv_cpu_over_gpu"]),
        (r"with them it gained only ([\d.]+)-([\d.]+)x", gpu["blocked_conv_cpu_over_gpu"]),
    ]
    assert_quoted(prose, claims, "02_gpu_numbers.json")
    assert gpu["large_gpu_fastest"] == "im2col" and gpu["large_gpu_auto_choice"] == "im2col", \
        "the prose says im2col as one block is the fastest of minidl's four on the GPU, and auto picks it"
    assert min((ms, name) for name, ms in gpu["large_gpu_ms"].items() if name != "im2col")[1] == "fft", \
        "the prose says FFT was the fastest while im2col was cut into blocks"
    assert gpu["test_accuracy_equal"], "the prose says both backends reach the same test accuracy"
    for name in ("02_gpu_layers.md", "02_gpu_sweep.md", "02_gpu_conv.md"):
        table = (ROOT / "tutorials" / "figures" / "out" / name).read_text().strip()
        assert " ".join(table.split()) in prose, f"chapter 2's copy of {name} is stale"
