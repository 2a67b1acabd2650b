"""An MPI job across emulated hosts: H network namespaces on this machine, R ranks on each.

    sudo python -m collectives.cluster --hosts 2 --ranks-per-host 2 --rate 1gbit -- \\
        python -m collectives.bench --sizes 64K,1M,16M --algorithms ring

1. builds H hosts h0 .. h{H-1} (collectives.cluster.netns: one network namespace each, a veth link from
   each to one bridge, addresses only inside the namespaces, the links limited to RATE by tc's
   token-bucket filter when --rate is given) and a head namespace where mpiexec runs;
2. writes a launcher shim, `<shim> [ssh options] HOST COMMAND`, which runs COMMAND in HOST's
   network namespace (`ip netns exec`) with HOST as its host name (a UTS namespace of its own), and
   hands it to the launcher as its ssh: MPICH's hydra (`mpiexec -launcher ssh -launcher-exec <shim>
   -hosts h0:R,h1:R,...`) or Open MPI's PRRTE (`mpirun --prtemca plm_ssh_agent <shim> --host ...`,
   with the allow-run-as-root variables, and mpi_yield_when_idle when the ranks outnumber the
   cores). The launcher starts one proxy or daemon per host through it, as with ssh on a real
   cluster; rank r runs on host r // R (block order);
3. runs PROGRAM ARGS as that job of H R ranks, the MPI layer told to reach ranks on other hosts by
   TCP on eth0 only (MPICH: UCX_TLS=tcp,self; Open MPI: the ob1 layer with its tcp and sm
   transports), shared memory staying the way within a host. This matters: the hosts share
   /dev/shm and the process table, and MPICH's default UCX transports find the other hosts' ranks
   through shared memory and never touch the links (0 bytes on them, measured);
4. prints what crossed the links, from their counters read before and after the job (every frame
   with its Ethernet, IP and TCP headers): the bytes between hosts, each host's sent and received
   bytes, the tbf queues' bytes with --rate, and mpiexec's own traffic (starting the proxies,
   forwarding output) apart; --json writes the same as an object;
5. removes every namespace on the way out: after the job, on an error, on Ctrl-C or SIGTERM.

Exit status: the job's (128 + n if a signal n ended it; 130 after Ctrl-C). `error: <why>` on
stderr and exit status 2 where the job cannot run: not root, no `ip`, `tc` or `unshare`, no
mpiexec (or one neither MPICH's hydra nor Open MPI's), a bad flag, the namespaces cannot be built.

Not emulated: latency (this kernel has no netem; a link's alpha is what veth and TCP give) and
separate file systems. --mpiexec picks the launcher (default: the one beside this Python); PROGRAM
must be a Python whose mpi4py was built for that MPI.
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

OPEN_MPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

SHIM = """#!/bin/sh
# hydra's ssh: {shim} [ssh options] HOST COMMAND...; runs COMMAND in HOST's network namespace
while [ "${{1#-}}" != "$1" ]; do shift; done
host=$1; shift
case "$host" in
  {hosts}) exec ip netns exec {tag}-"$host" unshare --uts sh -c "hostname $host && $*" ;;
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
    parser.add_argument("--mpiexec", help="MPICH's or Open MPI's mpiexec (default: the one beside this Python, "
                                          "else PATH's)")
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
    for flavour, banner in (("mpich", "HYDRA"), ("openmpi", "Open MPI")):
        if banner in done.stdout:
            return path, flavour
    raise Refused(f"{path} is neither MPICH's hydra mpiexec nor Open MPI's (the launchers supported)")


def check_machine():
    if os.geteuid() != 0:
        raise Refused("network namespaces need root (run as root or with sudo)")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            raise Refused(f"no `{tool}` on PATH ({package})")


def job_command(net, mpiexec, flavour, shim, ranks_per_host, command):
    """mpiexec in the head namespace, its ssh the shim, the hosts h0:R,h1:R,..., TCP between hosts."""
    hosts = ",".join(f"{host}:{ranks_per_host}" for host in net.hosts)
    ranks = len(net.hosts) * ranks_per_host
    head = ["ip", "netns", "exec", net.head, mpiexec]
    if flavour == "mpich":
        return (head + ["-launcher", "ssh", "-launcher-exec", shim, "-iface", "eth0", "-hosts", hosts, "-n", str(ranks)]
                + [arg for name, value in TCP_BETWEEN_HOSTS.items() for arg in ("-genv", name, value)] + command)
    # Open MPI: PRRTE's daemons through the shim; ob1 with TCP between hosts, shared memory within;
    # yield when idle if the ranks outnumber the cores (else a waiting rank spins on a core another needs)
    yield_when_idle = "1" if ranks > (os.cpu_count() or 1) else "0"
    return head + ["--prtemca", "plm_ssh_agent", shim, "--prtemca", "oob_tcp_if_include", "eth0",
                   "--mca", "pml", "ob1", "--mca", "btl", "self,sm,tcp", "--mca", "btl_tcp_if_include", "eth0",
                   "--mca", "mpi_yield_when_idle", yield_when_idle, "--host", hosts, "-np", str(ranks)] + command


def report(net, used, status):
    """The counters as printed lines and as a JSON object."""
    record = {"hosts": len(net.hosts), "rate": net.rate, "status": status,
              "bytes_between_hosts": used.between_hosts(), "sent": used.sent, "received": used.received,
              "qdisc_sent": used.qdisc if net.rate else None, "qdisc_dropped": used.dropped if net.rate else None,
              "mpiexec_sent": used.head_sent, "mpiexec_received": used.head_received}
    lines = [f"# cluster: {len(net.hosts)} hosts, rate {net.rate or 'unlimited'}; "
             f"bytes between hosts {record['bytes_between_hosts']}; "
             f"mpiexec's own traffic {used.head_sent} sent, {used.head_received} received"]
    for host in net.hosts:
        queue = f", tbf queue sent {used.qdisc[host]}, dropped {used.dropped[host]} packets" if net.rate else ""
        lines.append(f"#   {host}: link sent {used.sent[host]}, received {used.received[host]}{queue}")
    return lines, record


def run(args):
    """Build, run, report, remove; returns the job's exit status."""
    check_machine()
    mpiexec, flavour = find_mpiexec(args.mpiexec)
    with tempfile.TemporaryDirectory(prefix="minidl-cluster-") as folder, \
            netns.Network(args.hosts, rate=args.rate) as net:
        shim = os.path.join(folder, "netns-ssh")
        with open(shim, "w") as file:
            file.write(SHIM.format(shim=shim, hosts="|".join(net.hosts), tag=net.tag))
        os.chmod(shim, 0o755)
        before = net.counters()
        job = subprocess.Popen(job_command(net, mpiexec, flavour, shim, args.ranks_per_host, args.command),
                               env=dict(os.environ, **OPEN_MPI_AS_ROOT) if flavour == "openmpi" else None,
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
    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGINT, signal.SIGTERM)}
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
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
