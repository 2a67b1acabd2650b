"""Emulated hosts on one Linux machine: network namespaces joined by veth links to one switch.

    with Network(hosts=2, rate="1gbit") as net:   # as root; every namespace gone on leaving
        net.hosts                                 # ["h0", "h1"]: names the launcher shim maps
        net.namespace("h1")                       # the Linux network namespace of host h1
        before = net.counters(); ...; used = net.counters() - before

The picture (H hosts, one switch, one head where mpiexec runs):

    <tag>-h0 [eth0 10.199.0.1] ==veth== [p0]-+
    <tag>-h1 [eth0 10.199.0.2] ==veth== [p1]-+- bridge br0 in <tag>-sw (no address)
    ...                                       |
    <tag>-head [eth0 10.199.0.254] =veth= [ph]-+

Each host has its own network namespace (and, through collectives.cluster's launcher shim, its own
host name) and nothing else of its own: the processes of all hosts share the file system,
/dev/shm and the process table, so an MPI layer that looks for peers by
shared memory would find the other hosts' ranks there and bypass the links. collectives.cluster
therefore tells the MPI layer to reach other hosts by TCP only, and this module's counters show
whether it did: the bytes each host's link carried.

A link's bandwidth is set by a token-bucket filter (`tc qdisc ... tbf rate RATE`) on both of its
ends: the host's side limits what the host sends, the switch's side what it receives. This kernel
has no netem, so there is no added delay: a link's latency is what the veth pair and the kernel's
TCP stack give. Addresses exist only inside the namespaces; the machine's own network, routes and
interfaces are not touched. The tag (``mdl<pid>``) keeps two runs apart.
"""
import json
import os
import re
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.199.0"
HEAD_ADDRESS = f"{SUBNET}.254"
RATE_PATTERN = re.compile(r"^[0-9]+(\.[0-9]+)?([kmgt]?)(bit|bps)$")


def check_rate(text):
    """The rate as tc reads it ("1gbit", "200mbit", "50mbps"), or ValueError saying why not."""
    if not RATE_PATTERN.match(text.lower()) or float(re.match(r"[0-9.]+", text).group()) <= 0:
        raise ValueError(f"--rate {text!r}: expected a positive rate such as 1gbit, 200mbit or 50mbps")
    return text.lower()


def rate_bytes_per_second(text):
    """Bytes per second of a tc rate ("1gbit" -> 125e6; tc's k, m, g are powers of 1000)."""
    number, prefix, unit = RATE_PATTERN.match(text).groups()
    value = float(text[:len(text) - len(prefix) - len(unit)]) * 1000 ** "_kmgt".index(prefix or "_")
    return value / 8 if unit == "bit" else value


def ip(*args, namespace=None, check=True):
    """Run `ip [-n namespace] args...`; the output, or RuntimeError with ip's message."""
    command = ["ip"] + (["-n", namespace] if namespace else []) + [str(a) for a in args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass
class Counters:
    """Bytes each host's link carried: sent[h] out of host h, received[h] into it (its veth's
    counters, every frame with its Ethernet header), qdisc[h] what host h's tbf sent and dropped[h]
    the packets its two tbf queues (out of h, into h) dropped for want of room (None without a
    rate), and the head's (mpiexec's) link: what it sent and received."""
    sent: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)
    qdisc: dict = field(default_factory=dict)
    dropped: dict = field(default_factory=dict)
    head_sent: int = 0
    head_received: int = 0

    def __sub__(self, other):
        minus = lambda a, b: {k: (None if a[k] is None else a[k] - b[k]) for k in a}   # noqa: E731
        return Counters(minus(self.sent, other.sent), minus(self.received, other.received),
                        minus(self.qdisc, other.qdisc), minus(self.dropped, other.dropped),
                        self.head_sent - other.head_sent,
                        self.head_received - other.head_received)

    def between_hosts(self):
        """Bytes that went from one host to another: all that the hosts sent, less what the head got
        (every frame a host sends goes either to another host or to the head)."""
        return sum(self.sent.values()) - self.head_received


class Network:
    """H emulated hosts (a context manager: built on entry, removed on exit, whatever happened)."""

    def __init__(self, hosts, rate=None, tag=None):
        self.hosts = [f"h{index}" for index in range(hosts)]
        self.rate = rate
        self.tag = tag or f"mdl{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.head = f"{self.tag}-head"
        self.created = []

    def namespace(self, host):
        return f"{self.tag}-{host}"

    def address(self, host):
        return f"{SUBNET}.{self.hosts.index(host) + 1}"

    def __enter__(self):
        try:
            self.build()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def _add_namespace(self, name):
        ip("netns", "add", name)
        self.created.append(name)
        ip("link", "set", "lo", "up", namespace=name)
        # no IPv6: its neighbour discovery would add frames of its own to the links' counters
        subprocess.run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], capture_output=True, check=False)

    def _plug(self, namespace, port, address):
        """A veth pair: eth0 (with address) in namespace, port on the switch's bridge."""
        ip("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", namespace,
           namespace=self.switch)
        ip("link", "set", port, "master", "br0", "up", namespace=self.switch)
        ip("addr", "add", f"{address}/24", "dev", "eth0", namespace=namespace)
        ip("link", "set", "eth0", "up", namespace=namespace)

    def build(self):
        self._add_namespace(self.switch)
        ip("link", "add", "br0", "type", "bridge", namespace=self.switch)
        ip("link", "set", "br0", "up", namespace=self.switch)
        for index, host in enumerate(self.hosts):
            namespace = self.namespace(host)
            self._add_namespace(namespace)
            self._plug(namespace, f"p{index}", self.address(host))
            if self.rate:
                self.limit(namespace, "eth0")         # what the host sends
                self.limit(self.switch, f"p{index}")  # what the host receives
        self._add_namespace(self.head)
        self._plug(self.head, "ph", HEAD_ADDRESS)

    def limit(self, namespace, device):
        # a bucket of 2 ms of traffic (at least 64 KiB): smaller ones fall short of the rate (1gbit with a
        # 64 KiB bucket passed 85 MB/s of TCP here, with 256 KiB 118), larger ones let whole messages
        # through at memory speed (a 1.25 MB bucket passed a 2 MiB ping-pong at 250 MB/s)
        burst = max(64 << 10, int(rate_bytes_per_second(self.rate) / 500))
        # a queue of at most 10 ms: with tc's usual 50 ms, a pair of ranks exchanging at 1gbit got half
        # the rate each way (one TCP connection carries both directions, and each direction's ACKs
        # waited behind up to 50 ms of the other's data); with 5-10 ms, mostly the full rate
        command = ["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
                   "rate", self.rate, "burst", str(burst), "latency", "10ms"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed: {done.stderr.strip()}")

    def counters(self):
        """The links' byte counters now (see Counters)."""
        result = Counters()
        for index, host in enumerate(self.hosts):
            stats = _link_stats(self.namespace(host))
            result.sent[host], result.received[host] = stats["tx"]["bytes"], stats["rx"]["bytes"]
            out_of = _tbf_stats(self.namespace(host), "eth0") if self.rate else None
            into = _tbf_stats(self.switch, f"p{index}") if self.rate else None
            result.qdisc[host] = out_of["bytes"] if self.rate else None
            result.dropped[host] = out_of["drops"] + into["drops"] if self.rate else None
        head = _link_stats(self.head)
        result.head_sent, result.head_received = head["tx"]["bytes"], head["rx"]["bytes"]
        return result

    def remove(self):
        """Stop whatever still runs in the namespaces, then delete them (the veths go with them)."""
        for name in reversed(self.created):
            for pid in ip("netns", "pids", name, check=False).split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            ip("netns", "del", name, check=False)
        self.created = []


def _link_stats(namespace):
    [link] = json.loads(ip("-s", "-j", "link", "show", "eth0", namespace=namespace))
    return link["stats64"]


def _tbf_stats(namespace, device):
    done = subprocess.run(["tc", "-n", namespace, "-s", "-j", "qdisc", "show", "dev", device],
                          capture_output=True, text=True, check=True)
    [tbf] = [q for q in json.loads(done.stdout) if q["kind"] == "tbf"]
    return tbf
