"""A smoke run of ``python -m minidl.bench`` at tiny sizes: it runs, and its JSON has the promised fields."""
import importlib.util
import json
import subprocess
import sys

import pytest


def bench(tmp_path, *arguments):
    path = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "minidl.bench", *arguments, "--quick", "--repeats", "1",
                           "--json", str(path)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return json.loads(path.read_text()), done.stdout


def test_main_bench_writes_case_minidl_torch_ratio_and_gflops(tmp_path):
    rows, stdout = bench(tmp_path)
    summary = rows.pop()
    assert summary["case"] == "summary"
    stages = {(stage["layer"], stage["pass"], stage["stage"]) for stage in summary["stages"]}
    assert {("conv2d large", "forward", "im2col copy"), ("conv2d large", "weight gradient", "GEMM"),
            ("lenet conv2", "input gradient", "col2im"), ("lenet pool1", "forward", "max over windows")} <= stages
    assert all(stage["ms"] > 0 for stage in summary["stages"])
    assert "where the time goes" in stdout
    cases = [row["case"] for row in rows]
    assert "conv2d large fwd+bwd" in cases and "lenet5 train step" in cases and "mlp 784-256-256-10 train step" in cases
    have_torch = importlib.util.find_spec("torch") is not None
    for row in rows:
        assert {"case", "minidl_ms", "torch_ms", "ratio"} <= set(row)
        assert row["minidl_ms"] > 0
        if have_torch:
            assert row["torch_ms"] > 0 and row["ratio"] == pytest.approx(row["minidl_ms"] / row["torch_ms"], rel=1e-2)
        if row["kind"] in ("conv", "linear"):
            assert row["gflops"] > 0
    assert "GEMM" in stdout and "minidl_ms" in stdout


def test_conv_bench_has_every_algorithm_a_cost_and_a_summary(tmp_path):
    plot = tmp_path / "conv.png"
    rows, stdout = bench(tmp_path, "conv", "--no-torch", "--plot", str(plot))
    algorithms = {row["algorithm"] for row in rows if row["case"] != "summary"}
    assert algorithms == {"direct", "im2col", "fft", "winograd", "auto"}
    for row in rows[:-1]:
        assert row["multiplies_fwd_bwd"] > 0 and row["extra_elements"] >= 0 and row["torch_ms"] is None
    summary = rows[-1]
    assert summary["case"] == "summary" and summary["winograd_vs_im2col"] and "fft_crossover_kernel" in summary
    assert plot.stat().st_size > 1000 and "FFT beats im2col" in stdout
