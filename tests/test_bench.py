"""A smoke run of ``python -m minidl.bench`` at tiny sizes: it runs, and its JSON has the promised fields."""
import importlib
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


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
        else:                                            # no yardstick: no ratio and no verdict on the target
            assert row["torch_ms"] is None and row["ratio"] is None and row.get("met") is None, row
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


def row_of(case, minidl_ms, torch_ms):
    """The JSON row the bench builds for ``case`` from measured times (CPU, one thread, GEMM rate 100
    GFLOP/s): ``minidl.bench._row``, or ``minidl.bench.measure._row`` where the bench is a package."""
    bench = importlib.import_module("minidl.bench")
    build = getattr(bench, "_row", None) or importlib.import_module("minidl.bench.measure")._row
    return build(case, minidl_ms, torch_ms, 100.0, "cpu", 1)


def test_the_ratio_is_minidls_time_over_pytorchs_and_decides_the_target():
    """On times written here, so it runs where PyTorch is missing too: 3 ms against 2 ms is 1.5x."""
    case = {"case": "lenet5 train step", "kind": "step", "model": "lenet5", "batch": 64, "target_ratio": 1.2}
    slower = row_of(case, minidl_ms=3.0, torch_ms=2.0)
    assert (slower["minidl_ms"], slower["torch_ms"], slower["ratio"], slower["met"]) == (3.0, 2.0, 1.5, False)
    faster = row_of(case, minidl_ms=2.0, torch_ms=4.0)
    assert (faster["ratio"], faster["met"]) == (0.5, True)
    alone = row_of(case, minidl_ms=2.0, torch_ms=None)
    assert (alone["torch_ms"], alone["ratio"], alone["met"]) == (None, None, None)


def test_the_ddp_benchmark_takes_median_ratios_and_judges_the_target_from_them(monkeypatch, tmp_path):
    """algorithms.bench on times written here (no job runs): ratio = minidl / DDP per run, the row's
    ratio their median with [min, max], and "met" only when both minidl sides are <= 1.0x DDP."""
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
    runs = iter([{"ring": 5.0, "mpi": 1.0, "ddp": 4.0}] * 12)
    ddp.main(["--runs", "3", "--json", str(tmp_path / "rows.json")])
    assert all(row["ring_ratio"] == 1.25 and row["met"] is False
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
    from types import SimpleNamespace
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
        seen = _worker_environments(monkeypatch, measure, '{"times": {}}',
                                    lambda args: measure.run_worker("minidl", "sweep", args))
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
