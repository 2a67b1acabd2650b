"""Measure allreduce and allreduce SGD across emulated hosts (collectives.cluster); needs root.

    python tutorials/figures/make_10_cluster.py            # about 7 minutes on 2 cores
    python tutorials/figures/make_10_cluster.py --quick    # 2 sizes, 2 epochs, into a temporary folder
    python tutorials/figures/make_10_cluster.py --out DIR --rate 1gbit

Every job runs under `python -m collectives.cluster --hosts H --ranks-per-host R --rate RATE`: H
network namespaces joined by veth links, each link limited to RATE by a token bucket, TCP between
hosts, shared memory within one; ranks in block order (rank r on host r // R).

1. The link: `collectives.bench`'s ping-pong between ranks 0 and 1 on two hosts of one rank
   (8 B .. 64 MiB), and on one host of two ranks for shared memory. alpha is the median one-way
   time of the ping-pongs of <= 512 B; beta the slope through those of >= 8 MiB. Below that a
   ping-pong beats the rate: each direction's bucket refills while the other direction sends,
   and a message that fits in the bucket (2 ms of traffic) passes at memory speed. The bench's
   own one-line fit, pulled down by those, is shown beside. And what one pair of ranks can push
   through the links: 8 MiB between a rank on h0 and one on h1, one way or exchanged (both
   directions at once), one pair or two pairs at once, with the links limited and unlimited.
   -> 10_link.json
2. Allreduce across hosts: `collectives.bench --algorithms ring,rabenseifner` on 2 and 4 hosts of
   2 ranks, sizes 64 KiB .. 16 MiB, each measured time beside the two-level model
   (`two_level_model`: each round as long as its slowest transfer, a transfer that crosses a link
   sharing the link with the host's other ranks' transfers that round), and the bytes the links
   carried in the whole job. -> 10_allreduce.json, 10_allreduce.md
3. allreduce_sgd (ring, the default CNN and digits, seed 0) on 2 hosts x 2 ranks against
   `mpiexec -n 4` on this host alone: accuracy per epoch, and whether the saved parameters are the
   same bits. -> 10_sgd.json, and its lines in 10_allreduce.md

Timings depend on the machine and on what else runs on it; the bits of part 3 do not.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
PING_PONG = re.compile(r"^#\s+ping-pong\s+([\d.]+) (B|KiB|MiB):\s+([\d.]+) us", re.M)
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}
LARGE = 8 << 20            # ping-pongs at least this long give the link's beta
SMALL = 512                # and at most this long its alpha (their median: one slow batch does not move it)
SIZES, QUICK_SIZES = "64K,256K,1M,4M,16M", "64K,1M"
ALGORITHMS = ["ring", "rabenseifner"]
PAIR_BYTES = 8 << 20
ROUNDS = {"ring": lambda p: 2 * (p - 1), "rabenseifner": lambda p: 2 * (p.bit_length() - 1)}   # dependent rounds


def run(command, timeout=1200):
    done = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"error: `{' '.join(command)}` exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def cluster(hosts, per_host, rate, *program, links=None):
    flags = ["--hosts", str(hosts), "--ranks-per-host", str(per_host)] + (["--rate", rate] if rate else [])
    flags += ["--json", str(links)] if links else []
    return run([sys.executable, "-m", "collectives.cluster", *flags, "--", sys.executable, *program])


def ping_pong(hosts, per_host, rate, folder):
    """{alpha, beta (fit of >= 8 MiB), bench_alpha, bench_beta, points} of ranks 0 and 1."""
    out = folder / f"pingpong_{hosts}x{per_host}.json"
    text = cluster(hosts, per_host, rate, "-m", "collectives.bench", "--sizes", "4K", "--algorithms", "ring",
                   "--rounds", "1", "--json", str(out))
    points = [(int(float(size) * UNITS[unit]), float(us) * 1e-6) for size, unit, us in PING_PONG.findall(text)]
    record = json.loads(out.read_text())[0]
    large = np.array([(m, t) for m, t in points if m >= LARGE])
    slope, _ = np.polyfit(large[:, 0], large[:, 1], 1)
    alpha = float(np.median([t for m, t in points if m <= SMALL]))
    return {"alpha": alpha, "beta": float(slope), "bench_alpha": record["alpha"],
            "bench_beta": record["beta"], "gamma": record["gamma"], "points": points}


def pairs_worker():
    """(Run on 2 hosts x 2 ranks.) 8 MiB between rank r on h0 and r ^ 2 on h1: exchanged (Sendrecv, both
    directions at once) or sent one way, by one pair or both pairs at once; rank 0 prints JSON lines."""
    from mpi4py import MPI
    comm, size = MPI.COMM_WORLD, PAIR_BYTES
    rank = comm.Get_rank()
    out, back = np.ones(size, np.uint8), np.empty(size, np.uint8)

    def once(pattern, ranks):
        comm.Barrier()
        start = time.perf_counter()
        if rank in ranks and pattern == "exchange":
            comm.Sendrecv(out, dest=rank ^ 2, recvbuf=back, source=rank ^ 2)
        elif rank in ranks:
            comm.Send(out, dest=rank ^ 2) if rank < 2 else comm.Recv(back, source=rank ^ 2)
        comm.Barrier()
        return time.perf_counter() - start
    for pattern in ("one-way", "exchange"):
        for ranks in ({0, 2}, {0, 1, 2, 3}):
            seconds = min(once(pattern, ranks) for _ in range(4))
            if rank == 0:
                print(json.dumps({"pattern": pattern, "pairs": len(ranks) // 2, "seconds": seconds,
                                  "bytes_per_second_each_way": len(ranks) // 2 * size / seconds}), flush=True)


def pairs(rate):
    """pairs_worker's lines, run on 2 hosts x 2 ranks at this rate."""
    text = cluster(2, 2, rate, str(Path(__file__).resolve()), "--pairs-worker")
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def two_level_model(name, hosts, per_host, nbytes, link, shm, gamma):
    """Seconds of one allreduce of nbytes on hosts x per_host ranks in block order.

    A round lasts as long as its slowest transfer: alpha + bytes * beta, with the link's alpha and
    beta for a transfer between hosts, and the bytes of all the host's ranks that cross the link in
    that round (they share it); shared memory's for a transfer within a host. Plus the reduction,
    (p - 1)/p n gamma, as in collectives.model.cost.
      ring: 2 (p - 1) rounds of n/p bytes; each round one rank of each host sends across.
      rabenseifner (p a power of two): halving at distance p/2, ..., 1 with n/2, n/4, ... bytes, then
        doubling back; a round at distance >= per_host crosses, with every rank of the host sending.
    """
    p = hosts * per_host
    reduce = (p - 1) / p * nbytes * gamma

    def transfer(message, crossing):
        return (link["alpha"] + crossing * message * link["beta"] if crossing
                else shm["alpha"] + message * shm["beta"])
    if name == "ring":
        message = nbytes / p
        inside = transfer(message, 0) if per_host > 1 else 0.0
        return 2 * (p - 1) * max(transfer(message, 1), inside) + reduce
    if name == "rabenseifner":
        assert p & (p - 1) == 0, "the two-level model is for powers of two"
        total, distance, message = 0.0, p // 2, nbytes
        while distance >= 1:
            message /= 2
            total += 2 * transfer(message, per_host if distance >= per_host else 0)
            distance //= 2
        return total + reduce
    raise ValueError(name)


def allreduce_table(hosts, per_host, rate, sizes, link, shm, folder):
    out, links = folder / f"bench_{hosts}x{per_host}.json", folder / f"links_{hosts}x{per_host}.json"
    cluster(hosts, per_host, rate, "-m", "collectives.bench", "--sizes", sizes, "--algorithms", ",".join(ALGORITHMS),
            "--rounds", "3", "--json", str(out), links=links)
    rows = []
    for record in json.loads(out.read_text()):
        model = (two_level_model(record["algorithm"], hosts, per_host, record["bytes"], link, shm, link["gamma"])
                 if record["algorithm"] in ALGORITHMS else None)
        rounds = ROUNDS[record["algorithm"]](hosts * per_host) if record["algorithm"] in ROUNDS else None
        rows.append({"hosts": hosts, "ranks_per_host": per_host, "algorithm": record["algorithm"],
                     "bytes": record["bytes"], "seconds": record["seconds"], "model_seconds": model,
                     "model_over_measured": None if model is None else model / record["seconds"],
                     "excess_per_round": None if model is None else (record["seconds"] - model) / rounds})
    return rows, json.loads(links.read_text())


def sgd(rate, epochs, folder):
    """allreduce_sgd on 2 hosts x 2 ranks and on this host alone: logs and whether the params are equal."""
    flags = ["-m", "algorithms.allreduce_sgd", "--epochs", str(epochs), "--seed", "0"]
    cluster(2, 2, rate, *flags, "--save", str(folder / "hosts.npz"), "--log", str(folder / "hosts.jsonl"))
    run([MPIEXEC, "-n", "4", sys.executable, *flags, "--save", str(folder / "one.npz"),
         "--log", str(folder / "one.jsonl")])
    logs = {name: [json.loads(line) for line in (folder / f"{name}.jsonl").read_text().splitlines()]
            for name in ("hosts", "one")}
    with np.load(folder / "hosts.npz") as a, np.load(folder / "one.npz") as b:
        same = a["params"].tobytes() == b["params"].tobytes()
    return {"epochs": epochs, "same_bits": same,
            "accuracy": {name: [entry["test_accuracy"] for entry in log] for name, log in logs.items()},
            "seconds": {name: log[-1]["seconds"] for name, log in logs.items()}}


def markdown(link, shm, rows, sgd_result, rate):
    lines = [f"Links: tbf {rate}; inter-host alpha {link['alpha'] * 1e6:.1f} us, beta {link['beta'] * 1e9:.2f} ns/B "
             f"({1 / link['beta'] / 1e6:.0f} MB/s, ping-pongs >= 8 MiB); the bench's one-line fit: beta "
             f"{link['bench_beta'] * 1e9:.2f} ns/B. Shared memory within a host: alpha {shm['alpha'] * 1e6:.1f} us, "
             f"beta {shm['beta'] * 1e9:.3f} ns/B.", "",
             "| hosts x ranks | algorithm | bytes | measured ms | model ms | model / measured | within 25% "
             "| (measured - model) / rounds, ms |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        ratio, model, excess = row["model_over_measured"], row["model_seconds"], row["excess_per_round"]
        within = "-" if ratio is None or row["bytes"] < 64 << 10 else ("yes" if 0.75 <= ratio <= 1.25 else "NO")
        lines.append(f"| {row['hosts']} x {row['ranks_per_host']} | {row['algorithm']} | {row['bytes']} | "
                     f"{row['seconds'] * 1e3:.2f} | {'-' if ratio is None else f'{model * 1e3:.2f}'} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {within} | "
                     f"{'-' if ratio is None else f'{excess * 1e3:.2f}'} |")
    acc = sgd_result["accuracy"]
    lines += ["", f"allreduce_sgd, {sgd_result['epochs']} epochs, 2 hosts x 2 ranks: test accuracy "
              f"{acc['hosts'][-1]:.4f} in {sgd_result['seconds']['hosts']:.1f} s; one host, 4 ranks: "
              f"{acc['one'][-1]:.4f} in {sgd_result['seconds']['one']:.1f} s; parameters "
              f"{'the same bits' if sgd_result['same_bits'] else 'DIFFERENT'}."]
    return "\n".join(lines) + "\n"


def prepare(args):
    """(the output folder, made; the load average now), after `error:` and exit 2 if not root."""
    if os.geteuid() != 0:
        sys.stderr.write("error: the emulated hosts (collectives.cluster) need root\n")
        sys.exit(2)
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp()) if args.quick else HERE / "out")
    out.mkdir(parents=True, exist_ok=True)
    return out, os.getloadavg()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="folder for the results (default tutorials/figures/out; "
                                      "--quick: a temporary one)")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--pairs-worker", action="store_true", help=argparse.SUPPRESS)   # a rank of part 1's pairs
    args = parser.parse_args()
    if args.pairs_worker:
        return pairs_worker()
    out, load_before = prepare(args)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        link = ping_pong(2, 1, args.rate, folder)
        shm = ping_pong(1, 2, None, folder)
        streams = {rate or "unlimited": pairs(rate) for rate in (args.rate, None)}
        (out / "10_link.json").write_text(json.dumps({"rate": args.rate, "link": link, "shared_memory": shm,
                                                      "pairs": streams}, indent=1))
        print(f"link alpha {link['alpha'] * 1e6:.1f} us beta {link['beta'] * 1e9:.2f} ns/B", flush=True)
        rows, carried = [], {}
        for hosts in (2, 4):
            mine, carried[hosts] = allreduce_table(hosts, 2, args.rate, QUICK_SIZES if args.quick else SIZES,
                                                   link, shm, folder)
            rows += mine
            print("\n".join(f"{r['hosts']}x2 {r['algorithm']:>12} {r['bytes']:>9} {r['seconds'] * 1e3:9.2f} ms "
                            f"model/measured {r['model_over_measured'] or 0:.2f}" for r in mine), flush=True)
        sgd_result = sgd(args.rate, 2 if args.quick else 20, folder)
    load = {"before": load_before, "after": os.getloadavg()}    # 1, 5, 15-minute load averages of the machine
    (out / "10_allreduce.json").write_text(json.dumps({"rate": args.rate, "rows": rows, "links": carried,
                                                       "sgd": sgd_result, "load_average": load}, indent=1))
    (out / "10_sgd.json").write_text(json.dumps(sgd_result, indent=1))
    text = markdown(link, shm, rows, sgd_result, args.rate)
    text += "\n" + "\n".join(f"{PAIR_BYTES >> 20} MiB between hosts, links {rate}: {line['pattern']}, {line['pairs']} "
                             f"pair(s) at once: {line['seconds'] * 1e3:.1f} ms, "
                             f"{line['bytes_per_second_each_way'] / 1e6:.0f} MB/s each way"
                             for rate, lines in streams.items() for line in lines) + "\n"
    text += (f"\nLoad average of the machine ({os.cpu_count()} cores), 1 minute: {load['before'][0]:.1f} before, "
             f"{load['after'][0]:.1f} after.\n")
    (out / "10_allreduce.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
