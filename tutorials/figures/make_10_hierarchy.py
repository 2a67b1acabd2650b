"""Both hierarchies against flat allreduce across emulated hosts with slow links; needs root.

    python tutorials/figures/make_10_hierarchy.py            # about 4 minutes on 2 cores
    python tutorials/figures/make_10_hierarchy.py --quick    # 2 x 2 only, 2 sizes, into a temporary folder
    python tutorials/figures/make_10_hierarchy.py --rate 200mbit --out DIR

Two jobs, `python -m collectives.cluster --hosts H --ranks-per-host 2 --rate RATE` for H = 2 and 4
(links limited by tc's token bucket, TCP between hosts, shared memory within one; rank r on host
r // 2). In each job every rank runs `--worker` below:

1. the links: a ping-pong between rank 0 and the first rank of the next host (the link) and between
   ranks 0 and 1 (shared memory), single round trips after a barrier, the median: alpha is the
   median one-way time of the messages of <= 512 B, beta the slope through those of >= 1 MiB (the
   token bucket lets a short burst through at memory speed, so smaller ones beat the rate); gamma
   from calibrate.fit_gamma;
2. at each size, the flat ring, flat Rabenseifner, collectives.hierarchical with c = 2 (the two-level
   allreduce: reduce-scatter in the host, both ranks of a host each allreducing half of the vector with
   their twin on every other host, Rabenseifner for H a power of two, allgather in the host) and
   collectives.hierarchical_tree (the tree form: tree in the host, Rabenseifner between the H leaders,
   tree back), interleaved, each the median of single calls after a barrier, the best of --rounds;
   every sum checked.

Beside each time, the model: the flat ring's two-level model (make_10_cluster.two_level_model: one
rank per host crosses a link at each step, so every step costs the link's alpha + n/p beta),
collectives.model.two_level.predict_hierarchical with one NIC per host (the host's one link, which its
two ranks share in the steps across hosts) and predict_hierarchical_tree, at the (alpha, beta) of
shared memory and of the link that the same job fitted. The table says where the model expects the
two-level allreduce to beat the flat ring (model ring / model two-level > 1), where it was measured to,
how far the model of each hierarchy is from its measurement, and the bytes the links carried in each
job (the tbf queues' counters).
-> OUT/10_hierarchy.json, OUT/10_hierarchy.md
"""
import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent.parent))

# the book runs on the shipped defaults, never on a reader's tuning file (python -m minidl.tune)
os.environ["MINIDL_TUNING"] = "none"
from make_10_cluster import cluster, prepare, two_level_model  # noqa: E402

from collectives.model import two_level  # noqa: E402

SIZES, QUICK_SIZES = "4K,64K,256K,1M,4M,16M", "4K,1M"
PER_HOST = 2
NAMES = ("ring", "rabenseifner", "hierarchical", "hierarchical_tree")


def worker(sizes, rounds, min_time):
    """One rank of the job: rank 0 prints JSON lines (the links, then one per size and algorithm)."""
    from mpi4py import MPI

    from collectives import hierarchical, hierarchical_tree, rabenseifner, ring
    from collectives.bench import calibrate
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()

    def ping_pong(other, nbytes):
        message = np.zeros(nbytes, np.uint8)

        def once():
            if rank == 0:
                comm.Send(message, other, 11)
                comm.Recv(message, other, 11)
            elif rank == other:
                comm.Recv(message, 0, 11)
                comm.Send(message, 0, 11)
        return calibrate.timed(comm, once, min_time, median=True) / 2

    links = {}
    for name, other in (("link", PER_HOST), ("shared_memory", 1)):
        small = [ping_pong(other, m) for m in (8, 64, 512)]
        large = [(m, ping_pong(other, m)) for m in (1 << 20, 2 << 20, 4 << 20)]
        slope = np.polyfit([m for m, _ in large], [t for _, t in large], 1)[0]
        links[name] = {"alpha": float(np.median(small)), "beta": float(slope), "small": small, "large": large}
    links["gamma"] = calibrate.fit_gamma(comm, min_time, median=True)
    if rank == 0:
        print(json.dumps({"links": links}), flush=True)
    calls = {"ring": ring.allreduce, "rabenseifner": rabenseifner.allreduce,
             "hierarchical": lambda *a, **k: hierarchical.allreduce(*a, **k, ranks_per_node=PER_HOST),
             "hierarchical_tree": lambda *a, **k: hierarchical_tree.allreduce(*a, **k, ranks_per_node=PER_HOST)}
    for nbytes in sizes:
        sendbuf = np.full(nbytes // 4, rank + 1, np.float32)
        recvbuf = np.empty_like(sendbuf)
        best = {}
        for _ in range(rounds):
            for name in NAMES:
                seconds = calibrate.timed(comm, lambda: calls[name](comm, sendbuf, recvbuf, check=False),
                                          min_time, median=True)
                best[name] = min(best.get(name, np.inf), seconds)
                if not np.all(recvbuf == p * (p + 1) // 2):
                    raise SystemExit(f"rank {rank}: {name} gave a wrong sum at {nbytes} bytes")
        if rank == 0:
            for name in NAMES:
                print(json.dumps({"algorithm": name, "bytes": nbytes, "seconds": best[name]}), flush=True)


def job(hosts, rate, sizes, rounds, min_time, folder):
    links_file = folder / f"links_{hosts}.json"
    text = cluster(hosts, PER_HOST, rate, str(Path(__file__).resolve()), "--worker", "--sizes", sizes,
                   "--rounds", str(rounds), "--min-time", str(min_time), links=links_file)
    lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    fitted = lines[0]["links"]
    link, shm, gamma = fitted["link"], fitted["shared_memory"], fitted["gamma"]
    p = hosts * PER_HOST
    measured = {(r["algorithm"], r["bytes"]): r["seconds"] for r in lines[1:]}
    rows = []
    for nbytes in sorted({n for _, n in measured}):
        inside, across = (shm["alpha"], shm["beta"]), (link["alpha"], link["beta"])
        model = {"ring": two_level_model("ring", hosts, PER_HOST, nbytes, link, shm, gamma),
                 "rabenseifner": two_level_model("rabenseifner", hosts, PER_HOST, nbytes, link, shm, gamma),
                 "hierarchical": two_level.predict_hierarchical(p, nbytes, PER_HOST, inside, across, gamma,
                                                                nics_per_node=1),
                 "hierarchical_tree": two_level.predict_hierarchical_tree(p, nbytes, PER_HOST, inside, across, gamma)}
        rows.append({"hosts": hosts, "ranks_per_host": PER_HOST, "bytes": nbytes,
                     **{f"{name}_seconds": measured[name, nbytes] for name in NAMES},
                     **{f"{name}_model_seconds": model[name] for name in NAMES},
                     "model_speedup": model["ring"] / model["hierarchical"],
                     "measured_speedup": measured["ring", nbytes] / measured["hierarchical", nbytes]})
    carried = json.loads(links_file.read_text())
    return rows, {"link": link, "shared_memory": shm, "gamma": gamma,
                  "bytes_between_hosts": carried["bytes_between_hosts"], "qdisc_sent": carried["qdisc_sent"]}


def human(nbytes):
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def markdown(rows, fits, rate, load):
    lines = []
    for hosts, fit in fits.items():
        link, shm = fit["link"], fit["shared_memory"]
        lines.append(f"{hosts} x {PER_HOST}: link (tbf {rate}) alpha {link['alpha'] * 1e6:.0f} us, beta "
                     f"{link['beta'] * 1e9:.1f} ns/B ({1 / link['beta'] / 1e6:.0f} MB/s); shared memory alpha "
                     f"{shm['alpha'] * 1e6:.1f} us, beta {shm['beta'] * 1e9:.2f} ns/B; {fit['bytes_between_hosts']} "
                     f"bytes crossed the links in the job.")
    lines += ["", "| hosts x ranks | bytes | ring ms | two-level ms | tree form ms | Rabenseifner ms | model ring ms "
              "| model two-level ms | model tree form ms | model: ring / two-level | measured: ring / two-level "
              "| two-level wins: model, measured | model / measured: two-level, tree form |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = f"{'yes' if r['model_speedup'] > 1 else 'no'}, {'yes' if r['measured_speedup'] > 1 else 'no'}"
        fit = [r[f"{name}_model_seconds"] / r[f"{name}_seconds"] for name in ("hierarchical", "hierarchical_tree")]
        times = " | ".join(f"{r[key] * 1e3:.2f}" for key in (
            "ring_seconds", "hierarchical_seconds", "hierarchical_tree_seconds", "rabenseifner_seconds",
            "ring_model_seconds", "hierarchical_model_seconds", "hierarchical_tree_model_seconds"))
        lines.append(f"| {r['hosts']} x {r['ranks_per_host']} | {human(r['bytes'])} | {times} | "
                     f"{r['model_speedup']:.2f} | {r['measured_speedup']:.2f} | {verdict} | "
                     f"{fit[0]:.2f}, {fit[1]:.2f} |")
    lines += ["", f"Load average of the machine ({os.cpu_count()} cores), 1 minute: {load[0][0]:.1f} before, "
              f"{load[1][0]:.1f} after."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 x 2 only, 2 sizes, a temporary folder")
    parser.add_argument("--out", help="folder for the results (default tutorials/figures/out; --quick: a temporary "
                                      "one)")
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)     # a rank of a job
    parser.add_argument("--sizes", default=SIZES, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--min-time", type=float, default=0.05, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [int(s[:-1]) << (10 if s[-1] == "K" else 20) for s in args.sizes.split(",")]
    if args.worker:
        return worker(sizes, args.rounds, args.min_time)
    out, load_before = prepare(args)
    rows, fits = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for hosts in (2,) if args.quick else (2, 4):
            mine, fits[hosts] = job(hosts, args.rate, QUICK_SIZES if args.quick else SIZES, 1 if args.quick else 3,
                                    0.02 if args.quick else 0.05, Path(scratch))
            rows += mine
            print(f"{hosts} x {PER_HOST} done: " + ", ".join(f"{human(r['bytes'])} ring/hier "
                                                             f"{r['measured_speedup']:.2f} "
                                                             f"(model {r['model_speedup']:.2f})" for r in mine),
                  flush=True)
    load = [load_before, os.getloadavg()]
    (out / "10_hierarchy.json").write_text(json.dumps({"rate": args.rate, "rows": rows, "fits": fits,
                                                        "load_average": load}, indent=1))
    text = markdown(rows, fits, args.rate, load)
    (out / "10_hierarchy.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
