"""collectives.cluster: an MPI job across emulated hosts (network namespaces), and its error contract.

The job tests need root and working `ip netns` (they build namespaces); elsewhere they skip, saying so.
Each proves that the ranks' traffic went through the emulated links (their byte counters), and that
nothing of the emulation is left afterwards (`ip netns list` as before).
"""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from collectives.cluster import launch, netns
from tests.helpers import ENV, ROOT, mpiexec

MIB = 1 << 20


def _can_make_namespaces():
    if os.geteuid() != 0:
        return "not root: network namespaces need root and iproute2 (as root: apt-get install iproute2; .ci/run does)"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "no `ip` or `tc` on PATH: apt-get install iproute2 (.ci/run does, as root)"
    probe = f"mdlprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return (f"`ip netns add` fails here ({made.stderr.strip()}): network namespaces need root and a kernel "
                f"or container that allows them")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


WHY_NOT = _can_make_namespaces()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"{WHY_NOT}")


def namespaces(tag="mdl"):
    """The network namespaces whose names start with tag (a run's are "mdl<its pid>-h0", ...)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    return {name for name in listed if name.startswith(tag)}


def run_cluster(*flags, timeout=60):
    """`python -m collectives.cluster flags`: the completed process, with .tag its namespaces' prefix."""
    job = subprocess.Popen([sys.executable, "-m", "collectives.cluster", *flags], cwd=ROOT, env=ENV,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = job.communicate(timeout=timeout)
    finally:
        job.kill()
    done = subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)
    done.tag = f"mdl{job.pid}-"
    return done


@needs_namespaces
def test_ring_allreduce_across_two_hosts_goes_through_the_links(tmp_path):
    """2 hosts x 2 ranks, block order (ranks 0, 1 on h0; 2, 3 on h1), links at 1gbit: the ring's edges
    1 -> 2 and 3 -> 0 cross the links, each carrying 2 (p - 1) / p n bytes of the n-byte vector (plus
    headers), which the veths' and the token buckets' counters must both show; the result is checked
    bit for bit against MPI's own Allreduce by collectives.ring's demo (exit 1 otherwise)."""
    nbytes = 1 * MIB
    counters = tmp_path / "links.json"
    done = run_cluster("--hosts", "2", "--ranks-per-host", "2", "--rate", "1gbit", "--json", str(counters), "--",
                       sys.executable, "-m", "collectives.ring", "--length", str(nbytes // 8))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads(counters.read_text())
    p = 4
    per_edge = 2 * (p - 1) / p * nbytes
    assert record["rate"] == "1gbit"
    assert min(record["sent"].values()) >= per_edge and min(record["qdisc_sent"].values()) >= per_edge, record
    assert record["bytes_between_hosts"] >= 2 * per_edge, record
    assert f"bytes between hosts {record['bytes_between_hosts']}" in done.stdout
    assert namespaces(done.tag) == set()


HIERARCHY_JOB = """
import sys
import numpy as np
from mpi4py import MPI
from collectives import hierarchical
comm = MPI.COMM_WORLD
count, p, rank = int(sys.argv[1]), comm.Get_size(), comm.Get_rank()
result = hierarchical.allreduce(comm, np.arange(count, dtype=np.float32) % 7 + rank, check=False)
exact = p * (np.arange(count) % 7) + p * (p - 1) / 2          # small integers: exact in float32
sys.exit(0 if np.array_equal(result, exact.astype(np.float32)) else 1)
"""


@needs_namespaces
def test_the_hierarchy_sends_less_across_the_links_than_the_flat_ring(tmp_path):
    """The hierarchical allreduce (c = 2 from MINIDL_RANKS_PER_NODE) of n bytes on 2 hosts x 2 ranks: only
    the leaders (ranks 0 and 2) cross, Rabenseifner on 2 ranks, n/2 each way halving and n/2 doubling,
    so each host's link sends n bytes plus headers, against the flat ring's 1.5 n above; and the sum is
    exact (the job exits 1 otherwise)."""
    nbytes = 1 * MIB
    counters, program = tmp_path / "links.json", tmp_path / "job.py"
    program.write_text(HIERARCHY_JOB)
    done = subprocess.run([sys.executable, "-m", "collectives.cluster", "--hosts", "2", "--ranks-per-host", "2",
                           "--json", str(counters), "--", sys.executable, str(program), str(nbytes // 4)],
                          cwd=ROOT, env={**ENV, "MINIDL_RANKS_PER_NODE": "2"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sent = json.loads(counters.read_text())["sent"].values()
    assert all(nbytes <= bytes_ < 1.25 * nbytes for bytes_ in sent), sent


@needs_namespaces
def test_allreduce_sgd_across_two_hosts_gives_the_bits_of_one_host(tmp_path):
    """One epoch of allreduce SGD (ring, the digits CNN: 6090 float32 parameters, 12 steps at p = 4 and
    batch 32) on 2 hosts x 2 ranks and on this host alone: the same parameters, bit for bit (the ring adds
    in the same order wherever the ranks are); and each step's ring carried 2 (p - 1) / p of the
    24360-byte gradient over each of the two links."""
    flags = ["-m", "algorithms.allreduce_sgd", "--epochs", "1", "--seed", "0", "--quiet"]
    counters = tmp_path / "links.json"
    done = run_cluster("--hosts", "2", "--ranks-per-host", "2", "--json", str(counters), "--",
                       sys.executable, *flags, "--save", str(tmp_path / "hosts.npz"))
    assert done.returncode == 0, done.stderr[-2000:]
    alone = mpiexec(4, *flags, "--save", str(tmp_path / "one.npz"))
    assert alone.returncode == 0, alone.stderr[-2000:]
    with np.load(tmp_path / "hosts.npz") as hosts, np.load(tmp_path / "one.npz") as one:
        assert hosts["params"].tobytes() == one["params"].tobytes()
    steps, gradient = math.ceil(1438 / (4 * 32)), 6090 * 4
    assert json.loads(counters.read_text())["bytes_between_hosts"] >= 2 * steps * 2 * 3 / 4 * gradient


@needs_namespaces
def test_a_failing_job_gives_its_status_and_leaves_nothing():
    done = run_cluster("--hosts", "2", "--ranks-per-host", "1", "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3, done.stderr[-2000:]
    assert namespaces(done.tag) == set()


@needs_namespaces
def test_ctrl_c_removes_the_hosts():
    sleeping = f"time.sleep(60.{os.getpid()})"            # this test's ranks, by their command line
    job = subprocess.Popen([sys.executable, "-m", "collectives.cluster", "--hosts", "2", "--ranks-per-host", "1",
                            "--", sys.executable, "-c", f"import time; print('up', flush=True); {sleeping}"],
                           cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert job.stdout.readline().strip() == "up"
        assert len(namespaces(f"mdl{job.pid}-")) == 4    # h0, h1, the switch and the head
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=15) == 130
    finally:
        job.kill()
    time.sleep(0.2)
    assert namespaces(f"mdl{job.pid}-") == set()
    assert sleeping not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


# ---- the error contract: one line `error: <why>`, exit status 2, nothing built ----

@pytest.mark.parametrize("flags, why", [
    (["--hosts", "0", "--ranks-per-host", "1", "--", "true"], "--hosts 0"),
    (["--hosts", "two", "--ranks-per-host", "1", "--", "true"], "--hosts"),
    (["--hosts", "2", "--ranks-per-host", "0", "--", "true"], "--ranks-per-host 0"),
    (["--hosts", "2", "--ranks-per-host", "1", "--rate", "fast", "--", "true"], "--rate 'fast'"),
    (["--hosts", "2", "--ranks-per-host", "1", "--rate", "0mbit", "--", "true"], "--rate '0mbit'"),
    (["--hosts", "2", "--ranks-per-host", "1"], "no program to run"),
    (["--ranks-per-host", "1", "--", "true"], "--hosts"),
    (["--hosts", "2", "--ranks-per-host", "1", "--bogus", "--", "true"], "--bogus"),
    (["--hosts", "2", "--ranks-per-host", "1", "--json", "/no/such/folder/x.json", "--", "true"], "--json"),
])
def test_bad_flags_stop_with_error_and_status_2(flags, why, capsys):
    before = namespaces(f"mdl{os.getpid()}-") if shutil.which("ip") else set()
    assert launch.main(flags) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and why in lines[0], lines
    if shutil.which("ip"):
        assert namespaces(f"mdl{os.getpid()}-") == before == set()


def test_a_bad_flag_stops_the_command_with_status_2_and_one_line():
    done = run_cluster("--hosts", "0", "--ranks-per-host", "1", "--", "true", timeout=20)
    assert done.returncode == 2 and done.stderr == "error: --hosts 0: expected 1 to 200\n", done.stderr


def test_not_root_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)
    assert launch.main(["--hosts", "2", "--ranks-per-host", "1", "--", "true"]) == 2
    assert capsys.readouterr().err == "error: network namespaces need root (run as root or with sudo)\n"


def test_no_ip_command_is_refused(monkeypatch, capsys):
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    monkeypatch.setattr(launch.shutil, "which", lambda tool: None if tool == "ip" else "/bin/" + tool)
    assert launch.main(["--hosts", "2", "--ranks-per-host", "1", "--", "true"]) == 2
    assert capsys.readouterr().err == "error: no `ip` on PATH (iproute2)\n"


def test_an_mpiexec_neither_hydra_nor_open_mpi_is_refused(monkeypatch, capsys, tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Intel(R) MPI Library) 2021'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    which = shutil.which                          # the machine's tools pretended present: only mpiexec is refused
    monkeypatch.setattr(launch.shutil, "which",
                        lambda tool, *args, **kwargs: "/bin/" + tool if tool in ("ip", "tc", "unshare")
                        else which(tool, *args, **kwargs))
    assert launch.main(["--hosts", "2", "--ranks-per-host", "1", "--mpiexec", str(fake), "--", "true"]) == 2
    assert "is neither MPICH's hydra mpiexec nor Open MPI's" in capsys.readouterr().err


def test_tc_rates_in_bytes_per_second():
    """tc's prefixes are powers of 1000, and 'bit' is a bit, 'bps' a byte (tc(8))."""
    assert netns.rate_bytes_per_second("1gbit") == 125e6
    assert netns.rate_bytes_per_second("200mbit") == 25e6
    assert netns.rate_bytes_per_second("50mbps") == 50e6
    assert netns.rate_bytes_per_second("800kbit") == 100e3


# ---- the two-level model of tutorials/figures/make_10_cluster.py ----

def _make_10():
    import importlib.util
    script = ROOT / "tutorials" / "figures" / "make_10_cluster.py"
    spec = importlib.util.spec_from_file_location("make_10_cluster", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LINK, SHM, GAMMA = {"alpha": 20e-6, "beta": 8e-9}, {"alpha": 5e-6, "beta": 0.2e-9}, 0.1e-9


def test_two_level_model_with_one_rank_per_host_is_the_flat_model():
    """One rank per host: every transfer crosses a link alone, so the plain alpha-beta-gamma formulas hold."""
    model = _make_10().two_level_model
    n = 1 << 20
    for p in (2, 4, 8):
        assert math.isclose(model("ring", p, 1, n, LINK, SHM, GAMMA),
                            2 * (p - 1) * (20e-6 + n / p * 8e-9) + (p - 1) / p * n * GAMMA)
        rounds = p.bit_length() - 1
        assert math.isclose(model("rabenseifner", p, 1, n, LINK, SHM, GAMMA),
                            2 * rounds * 20e-6 + 2 * (p - 1) / p * n * 8e-9 + (p - 1) / p * n * GAMMA)


def test_two_level_model_shares_the_link_among_a_hosts_ranks():
    """2 hosts x 2 ranks, block order. Ring: one rank per host sends n/4 across per round, 6 rounds.
    Rabenseifner: halving at distance 2 crosses with both ranks sending n/2 (n on the link), distance 1
    stays inside with n/4; the doubling mirrors it."""
    model = _make_10().two_level_model
    n = 1 << 20
    assert math.isclose(model("ring", 2, 2, n, LINK, SHM, GAMMA), 6 * (20e-6 + n / 4 * 8e-9) + 0.75 * n * GAMMA)
    assert math.isclose(model("rabenseifner", 2, 2, n, LINK, SHM, GAMMA),
                        2 * (20e-6 + n * 8e-9) + 2 * (5e-6 + n / 4 * 0.2e-9) + 0.75 * n * GAMMA)
