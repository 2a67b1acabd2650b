"""An MPI job across emulated hosts: H network namespaces on this machine, R ranks on each.

    sudo python -m collectives.cluster --hosts 2 --ranks-per-host 2 --rate 1gbit -- \\
        python -m collectives.bench --sizes 64K,1M,16M --algorithms ring

1. builds H hosts h0 .. h{H-1} (collectives.netns: one network namespace each, a veth link from
   each to one bridge, addresses only inside the namespaces, the links limited to RATE by tc's
   token-bucket filter when --rate is given) and a head namespace where mpiexec runs;
2. writes a launcher shim, `<shim> [ssh options] HOST COMMAND`, which runs COMMAND in HOST's
   namespace (`ip netns exec`), and hands it to MPICH's hydra as its ssh
   (`mpiexec -launcher ssh -launcher-exec <shim> -hosts h0:R,h1:R,...`): hydra starts one proxy per
   host through it, as it would with ssh on a real cluster, and the ranks of host h run in h's
   namespace, ranks h R .. h R + R - 1 (block order: rank r on host r // R);
3. runs PROGRAM ARGS as that job of H R ranks, with the MPI layer told to reach ranks on other
   hosts by TCP only (UCX_TLS=tcp,self; shared memory stays the way within a host). This matters:
   the hosts share /dev/shm and the process table, and UCX's default transports would find the
   other hosts' ranks through shared memory and never touch the links;
4. prints what crossed the links, from their counters read before and after the job (every frame
   with its Ethernet, IP and TCP headers): the bytes between hosts, each host's sent and received
   bytes, the tbf queues' bytes with --rate, and mpiexec's own traffic (starting the proxies,
   forwarding output) apart; --json writes the same as an object;
5. removes every namespace on the way out: after the job, on an error, on Ctrl-C or SIGTERM.

Exit status: the job's (128 + n if a signal n ended it; 130 after Ctrl-C). `error: <why>` on
stderr and exit status 2 where the job cannot run: not root, no `ip` or `tc`, no mpiexec, a bad
flag, the namespaces cannot be built.

Not emulated: latency (this kernel has no netem; a link's alpha is what veth and TCP give) and
separate file systems. Only MPICH's hydra launcher is supported (mpi4py's `mpich` wheel).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from . import netns

TCP_BETWEEN_HOSTS = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "eth0", "MPIR_CVAR_CH4_NETMOD": "ucx",
                     "UCX_WARN_UNUSED_ENV_VARS": "n"}

SHIM = """#!/bin/sh
# hydra's ssh: {shim} [ssh options] HOST COMMAND...; runs COMMAND in HOST's network namespace
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  {hosts}) exec ip netns exec {tag}-"$host" sh -c "$*" ;;
  *) echo "error: no emulated host $host" >&2; exit 255 ;;
esac
"""


class Refused(Exception):
    """The job cannot run: the message says why."""


class Stopped(BaseException):
    """A signal (Ctrl-C, SIGTERM) asked us to stop: unwind, removing the namespaces."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Parser(argparse.ArgumentParser):
    def error(self, message):                      # one line and status 2, not argparse's usage text
        raise Refused(message)


def parse(argv):
    parser = Parser(prog="python -m collectives.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, required=True, help="emulated hosts (network namespaces)")
    parser.add_argument("--ranks-per-host", type=int, required=True, help="MPI ranks on each host")
    parser.add_argument("--rate", help="each link's bandwidth, as tc reads it: 1gbit, 200mbit, 50mbps")
    parser.add_argument("--mpiexec", help="MPICH's mpiexec (default: the one beside this Python, else PATH's)")
    parser.add_argument("--json", help="write the links' counters and the job's status to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        raise Refused("no program to run: give it after --, e.g. -- python -m collectives.bench --quick")
    if not 1 <= args.hosts <= 200:
        raise Refused(f"--hosts {args.hosts}: expected 1 to 200")
    if not 1 <= args.ranks_per_host <= 64:
        raise Refused(f"--ranks-per-host {args.ranks_per_host}: expected 1 to 64")
    if args.rate is not None:
        try:
            args.rate = netns.check_rate(args.rate)
        except ValueError as error:
            raise Refused(str(error)) from None
    if args.json and not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
        raise Refused(f"--json {args.json}: its folder does not exist")
    return args


def find_mpiexec(given):
    path = given or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    path = path if os.path.isfile(path) else shutil.which(given or "mpiexec")
    if not path or not os.access(path, os.X_OK):
        raise Refused(f"no mpiexec{' at ' + given if given else ' beside ' + sys.executable + ' or on PATH'}")
    done = subprocess.run([path, "--version"], capture_output=True, text=True)
    if "HYDRA" not in done.stdout:
        raise Refused(f"{path} is not MPICH's hydra mpiexec (only that launcher is supported)")
    return path


def check_machine():
    if os.geteuid() != 0:
        raise Refused("network namespaces need root (run as root or with sudo)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Refused(f"no `{tool}` on PATH (iproute2)")


def job_command(net, mpiexec, shim, ranks_per_host, command):
    hosts = ",".join(f"{host}:{ranks_per_host}" for host in net.hosts)
    return (["ip", "netns", "exec", net.head, mpiexec, "-launcher", "ssh", "-launcher-exec", shim,
             "-iface", "eth0", "-hosts", hosts, "-n", str(len(net.hosts) * ranks_per_host)]
            + [arg for name, value in TCP_BETWEEN_HOSTS.items() for arg in ("-genv", name, value)] + command)


def report(net, used, status):
    """The counters as printed lines and as a JSON object."""
    record = {"hosts": len(net.hosts), "rate": net.rate, "status": status,
              "bytes_between_hosts": used.between_hosts(), "sent": used.sent, "received": used.received,
              "qdisc_sent": used.qdisc if net.rate else None,
              "mpiexec_sent": used.head_sent, "mpiexec_received": used.head_received}
    lines = [f"# cluster: {len(net.hosts)} hosts, rate {net.rate or 'unlimited'}; "
             f"bytes between hosts {record['bytes_between_hosts']}; "
             f"mpiexec's own traffic {used.head_sent} sent, {used.head_received} received"]
    for host in net.hosts:
        queue = f", tbf queue sent {used.qdisc[host]}" if net.rate else ""
        lines.append(f"#   {host}: link sent {used.sent[host]}, received {used.received[host]}{queue}")
    return lines, record


def run(args):
    """Build, run, report, remove; returns the job's exit status."""
    check_machine()
    mpiexec = find_mpiexec(args.mpiexec)
    with tempfile.TemporaryDirectory(prefix="minidl-cluster-") as folder, \
            netns.Network(args.hosts, rate=args.rate) as net:
        shim = os.path.join(folder, "netns-ssh")
        with open(shim, "w") as file:
            file.write(SHIM.format(shim=shim, hosts="|".join(net.hosts), tag=net.tag))
        os.chmod(shim, 0o755)
        before = net.counters()
        job = subprocess.Popen(job_command(net, mpiexec, shim, args.ranks_per_host, args.command),
                               start_new_session=True)
        try:
            status = job.wait()
        except Stopped:
            os.killpg(job.pid, signal.SIGTERM)
            try:
                job.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
            raise
        status = 128 - status if status < 0 else status
        lines, record = report(net, net.counters() - before, status)
        print("\n".join(lines), flush=True)
        if args.json:
            with open(args.json, "w") as file:
                json.dump(record, file, indent=1)
    return status


def main(argv=None):
    def stop(signum, frame):
        raise Stopped(signum)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        return run(parse(sys.argv[1:] if argv is None else argv))
    except Refused as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    except RuntimeError as error:                  # ip or tc failed while building the hosts
        sys.stderr.write(f"error: cannot build the emulated hosts: {error}\n")
        return 2
    except Stopped as stopped:
        sys.stderr.write(f"# cluster: stopped by signal {stopped.signum}; emulated hosts removed\n")
        return 128 + stopped.signum


if __name__ == "__main__":
    sys.exit(main())
