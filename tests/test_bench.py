"""A smoke run of ``python -m minidl.bench`` at tiny sizes: it runs, and its JSON has the promised fields."""
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.helpers import ROOT


def bench(tmp_path, *arguments):
    path = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "minidl.bench", *arguments, "--quick", "--repeats", "1",
                           "--rounds", "2", "--json", str(path)], capture_output=True, text=True, timeout=240)
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
        assert {"case", "minidl_ms", "torch_ms", "median_ratio", "ratio_range"} <= set(row) and row["rounds"] == 2
        assert row["minidl_ms"] > 0
        if have_torch:
            low, high = row["ratio_range"]
            assert row["torch_ms"] > 0 and low <= row["median_ratio"] <= high, row
        else:                                            # no yardstick: no ratio and no verdict on the target
            assert row["torch_ms"] is None and row["median_ratio"] is None and row.get("met") is None, row
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


def row_of(case, **times):
    """The JSON row the bench builds for ``case`` from each side's times, one per round (CPU, one thread,
    GEMM rate 100 GFLOP/s)."""
    from minidl.bench import measure
    return measure._row(case, times, 100.0, "cpu", 1)


def test_a_ratio_is_the_median_of_the_rounds_ratios_and_decides_the_target():
    """On times written here, so it runs where PyTorch is missing too. Rounds of 3 against 2 ms, 2 against
    4 and 10 against 4 are ratios 1.5, 0.5 and 2.5: the median 1.5 with [0.5, 2.5] (the medians' ratio,
    3 / 4, would say 0.75), over LeNet-5's 1.0x; the time is each side's median."""
    case = {"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": 64, "target_ratio": 1.0}
    slower = row_of(case, minidl=[3.0, 2.0, 10.0], torch=[2.0, 4.0, 4.0])
    assert (slower["minidl_ms"], slower["torch_ms"], slower["rounds"]) == (3.0, 4.0, 3)
    assert (slower["median_ratio"], slower["ratio_range"], slower["met"]) == (1.5, [0.5, 2.5], False)
    faster = row_of(case, minidl=[2.0, 1.9, 2.1], torch=[2.0, 2.0, 2.0])
    assert (faster["median_ratio"], faster["ratio_range"], faster["met"]) == (1.0, [0.95, 1.05], True)
    alone = row_of(case, minidl=[2.0])
    assert (alone["torch_ms"], alone["median_ratio"], alone["met"]) == (None, None, None)


def test_the_layer_is_judged_on_its_median_over_the_floor():
    layer = {"case": "conv 64->64 32x32", "kind": "conv", "shape": (16, 64, 64, 32, 3, 1, 1), "algorithm": "im2col",
             "batch": 16, "target_floor": 1.10}
    row = row_of(layer, minidl=[11.0, 10.0, 12.0], torch=[10.0] * 3, floor=[10.0, 10.0, 9.0])
    assert (row["floor_ms"], row["median_over_floor"], row["over_floor_range"]) == (10.0, 1.1, [1.0, 1.333])
    assert row["target"] == "<= 1.1x floor" and row["met"] is True
    assert row_of(layer, minidl=[11.5, 11.2, 11.4], floor=[10.0] * 3)["met"] is False


def test_rounds_take_every_side_once_in_an_order_rotated_from_round_to_round():
    """The interleaving itself: A B F, B F A, F A B, ... (each worker a fake that notes what it was asked)."""
    from minidl.bench import measure
    asked = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def ask(self, request):
            asked.append((self.name, request.get("floor", False), request["case"]))
            return {"ms": float(len(asked))}
    mine, theirs = Fake("minidl"), Fake("torch")
    times = measure.time_in_rounds({"minidl": (mine, {}), "torch": (theirs, {}), "floor": (mine, {"floor": True})},
                                   7, 4)
    sides = [("minidl", False), ("torch", False), ("minidl", True)]
    assert asked == [(side[0], side[1], 7) for turn in range(4) for side in sides[turn % 3:] + sides[:turn % 3]]
    assert times["minidl"] == [1.0, 6.0, 8.0, 10.0] and times["floor"] == [3.0, 5.0, 7.0, 12.0]


def test_launches_count_how_many_medians_met_each_target(monkeypatch, tmp_path, capsys):
    """--launches 3 on a fake measure: launch k meets the LeNet-5 row unless k == 1; the summary counts."""
    from minidl.bench import cli
    launches = iter(range(3))

    def fake(suite, args):
        k = next(launches)
        row = {"case": "lenet5 train step", "kind": "step", "device": "cpu", "batch": 16, "minidl_ms": 1.0,
               "torch_ms": 1.0, "median_ratio": 0.9 + 0.2 * (k == 1), "ratio_range": [0.8, 1.3],
               "target": "<= 1.0x torch", "met": k != 1}
        return [row], {"gemm_gflops": 1.0 + k, "torch_gemm_gflops": 10.0 + k, "torch_version": "x", "gpu": False,
                       "gpu_name": None, "cupy_gemm_gflops": None, "torch_cuda_gemm_gflops": None, "rounds": 1}
    monkeypatch.setattr(cli, "measure", fake)
    loads = iter([0.5, 1.5, 2.5])
    monkeypatch.setattr(cli.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    cli.main(["sweep", "--launches", "3", "--json", str(tmp_path / "rows.json")])
    *rows, summary = json.loads((tmp_path / "rows.json").read_text())
    assert [row["launch"] for row in rows] == [0, 1, 2] and summary["launches"] == 3
    # each launch's own rates and the load as it began, in launch order
    machine = summary["machine"]
    assert machine["gemm_gflops_launches"] == [1.0, 2.0, 3.0] and machine["torch_gemm_gflops_launches"] == [10.0, 11.0,
                                                                                                             12.0]
    assert machine["load_launches"] == [0.5, 1.5, 2.5]
    assert [(t["case"], t["met_launches"], t["launches"]) for t in summary["targets"]] == [("lenet5 train step", 2, 3)]
    assert "2 of 3" in capsys.readouterr().out


def test_a_launch_that_could_not_judge_a_target_counts_as_not_meeting_it():
    """A launch whose PyTorch side failed has no ratio for the row (met None): the count is out of every
    launch run, 1 of 3, never 1 of 2, which would read as a target met in most launches."""
    from minidl.bench import cli
    row = {"case": "lenet5 train step", "batch": 16, "device": "cpu", "target": "<= 1.0x torch"}
    counts = cli.count_targets([[dict(row, met=True)], [dict(row, met=None)], [dict(row, met=False)]])
    assert [(c["met_launches"], c["launches"], c["launches met"]) for c in counts] == [(1, 3, "1 of 3")]


def test_the_ddp_benchmark_takes_median_ratios_and_judges_the_target_from_them(monkeypatch, tmp_path):
    """algorithms.bench on times written here (no job runs): ratio = minidl / DDP per run, the row's
    ratio their median with [min, max], and "met" only when both minidl sides are <= 0.9x DDP."""
    from algorithms import bench as ddp
    runs = iter([{"ring": 2.0, "mpi": 1.0, "ddp": 4.0}, {"ring": 3.0, "mpi": 1.0, "ddp": 4.0},
                 {"ring": 6.0, "mpi": 1.0, "ddp": 4.0}] * 4)
    current = {}

    def fake(side, model, batch, args):
        if side == "ring":
            current.update(next(runs))
        return {"ms": current[side], "phases": None}
    monkeypatch.setattr(ddp, "run_case", fake)
    monkeypatch.setattr(ddp, "torch_installed", lambda: True)
    ddp.main(["--runs", "3", "--json", str(tmp_path / "rows.json")])
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert len(rows) == 4 and all(row["ring_ms"] == 3.0 and row["ddp_ms"] == 4.0 for row in rows)
    assert all(row["ring_ratio"] == 0.75 and row["ring_ratio_range"] == [0.5, 1.5] for row in rows)
    assert all(row["mpi_ratio"] == 0.25 and row["met"] is True for row in rows)
    runs = iter([{"ring": 3.8, "mpi": 1.0, "ddp": 4.0}] * 12)           # 0.95x DDP: over the 0.9x target
    ddp.main(["--runs", "3", "--json", str(tmp_path / "rows.json")])
    assert all(row["ring_ratio"] == 0.95 and row["met"] is False
               for row in json.loads((tmp_path / "rows.json").read_text()))


def test_the_ddp_benchmark_runs_its_jobs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "algorithms.bench", "--quick", "--no-torch", "--json",
                           str(tmp_path / "rows.json")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [row["model"] for row in rows] == ["lenet5", "mlp"]
    assert all(row["ring_ms"] > 0 and row["mpi_ms"] > 0 and row["ddp_ms"] is None and row["met"] is None
               for row in rows)
    assert all(set(row["ring_phases"]) == {"forward", "backward", "allreduce", "update"}
               and all(ms > 0 for ms in row["ring_phases"].values()) for row in rows)


def _worker_environments(monkeypatch, module, answer, start_each):
    """The environments ``module``'s workers get with --blas as-set, then native, on a machine that
    forces OpenBLAS's kernel (subprocess.run faked: nothing runs)."""
    seen = {"as-set": [], "native": []}
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    for blas in seen:
        monkeypatch.setattr(module.subprocess, "run", lambda command, env, **kwargs: seen[blas].append(env)
                            or SimpleNamespace(returncode=0, stdout=answer + "\n", stderr=""))
        start_each(SimpleNamespace(threads=1, repeats=1, clock="cpu", quick=True, ranks=2, steps=1, warmup=0,
                                   blas=blas))
    return seen


@pytest.mark.parametrize("benchmark", ["minidl.bench", "algorithms.bench"])
def test_blas_native_leaves_a_forced_openblas_kernel_out_of_the_workers_only(monkeypatch, benchmark):
    from algorithms import bench as ddp
    from minidl.bench import measure
    if benchmark == "minidl.bench":
        seen = {"as-set": [], "native": []}
        monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
        monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
        for blas in seen:
            monkeypatch.setattr(measure, "Worker", lambda name, command, env: seen[blas].append(env))
            measure.start_worker("minidl", "sweep", SimpleNamespace(threads=1, repeats=1, clock="cpu", quick=True,
                                                                    blas=blas))
    else:                                         # both sides' jobs: minidl's and PyTorch DDP's
        seen = _worker_environments(monkeypatch, ddp, '{"ms": 1.0, "phases": null}',
                                    lambda args: [ddp.run_case(side, "mlp", 4, args) for side in ("ring", "ddp")])
    assert seen["as-set"] and all((env["OPENBLAS_CORETYPE"], env["OPENBLAS_L2_SIZE"]) == ("Haswell", "512")
                                  for env in seen["as-set"])
    assert seen["native"] and all("OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
                                  for env in seen["native"])
    assert all(env["OPENBLAS_NUM_THREADS"] == "1" for envs in seen.values() for env in envs)   # one thread a worker
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"               # this process's own setting untouched


@pytest.mark.parametrize("arguments, says", [(["--repeats", "0"], "--repeats must be at least 1"),
                                             (["--rounds", "0"], "--rounds must be at least 1"),
                                             (["--launches", "0"], "--launches must be at least 1"),
                                             (["--threads", "0"], "--threads must be at least 1"),
                                             (["--json", "/nonexistent/rows.json"], "--json /nonexistent/rows.json"),
                                             (["--plot", "/"], "--plot /: cannot write there"),
                                             (["--blas", "bogus"], "--blas: invalid choice")])
def test_a_bad_flag_is_one_error_line_and_exit_2_before_anything_runs(arguments, says):
    done = subprocess.run([sys.executable, "-m", "minidl.bench", "sweep", "--quick", "--no-torch", *arguments],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout[-300:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr


def test_the_ddp_benchmark_runs_only_the_cases_named_and_refuses_others(monkeypatch, tmp_path):
    from algorithms import bench as ddp
    ran = []

    def fake(side, model, batch, args):
        ran.append((model, batch))
        return {"ms": 1.0, "phases": None}
    monkeypatch.setattr(ddp, "run_case", fake)
    ddp.main(["--runs", "1", "--no-torch", "--cases", "mlp:32,lenet5:128", "--json", str(tmp_path / "rows.json")])
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [(row["model"], row["batch"]) for row in rows] == [("mlp", 32), ("lenet5", 128)]
    assert set(ran) == {("mlp", 32), ("lenet5", 128)}
    for value in ("lenet5:64", "resnet:32", "lenet5", "", "mlp:32,"):
        with pytest.raises(ddp.cli.SettingError, match="--cases"):
            ddp.parse_cases(value)
    done = subprocess.run([sys.executable, "-m", "algorithms.bench", "--cases", "lenet5:64"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 2 and done.stdout == "", done.stdout[-300:]
    assert done.stderr.startswith("error: --cases lenet5:64") and done.stderr.count("\n") == 1, done.stderr
