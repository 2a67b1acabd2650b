"""A sandbox for untrusted student code: a job of the student's tree that speaks only in frames of data.

    from tutorials.assignments import sandbox          # as root, with bubblewrap installed
    reply = sandbox.call("hw3", "collectives.ring", "ring_allgather_in_place",
                         [{"data": x0}, {"data": x1}, {"data": x2}], nprocs=3, timeout=30)
    reply[2]["data"]                    # rank 2's `data` after the call ("return": what it returned)
    sandbox.run(["id", "-u"], "hw3", timeout=10).output         # any command: a Result
    with sandbox.Job("hw3", "serve") as job:                    # the grader's: frames both ways
        job.send(arrays); job.receive(deadline)

The grader's checks and answers stay in its own processes; the student's code runs here and can
influence only the data it hands back (tutorials/assignments/replies.py says what that may be).
tests/test_sandbox.py attacks it.

**The sandbox** (root and bubblewrap with namespaces; ``why_not()`` says what is missing, with
the line to install it): its own network (loopback only), PID, IPC and hostname namespaces, a
new session, death with its parent; setpriv drops root for a uid of the job's own (drawn afresh for
each job, so that no two jobs share what the kernel keeps per uid, such as a keyring) without
capabilities or new privileges. It sees only the student tree (read-only, ``/student``), the interpreter
(``sys.prefix``, ``sys.base_prefix``), ``/usr``, ``/sys`` (all read-only), its own ``/proc`` and
``/dev``, a private ``/tmp`` and ``/dev/shm`` (MPICH needs it), and the grader's driver files
(read-only, ``/io``): nothing else of the grader's checkout (tests, hidden tests, answers).
``Limits`` per process (``prlimit``): address space (3 GiB), processes of the uid, CPU seconds,
file size, no core files. Closing a job kills its whole PID namespace, forked daemons included.
It talks over two pipes (channel.py's frames: arrays in an .npz, lengths capped, no pickle): no
reply file, nothing whose path a student could find.

**A broker.** The grader's tests run as an unprivileged uid of their own, which cannot start
bubblewrap as root; ``tests/grade.py`` (root) then lends them an inherited socket
(``$MINIDL_SANDBOX_BROKER``): a ``Job`` asks it for a sandboxed process and gets back only the
two pipes' ends, and the broker kills the job when the asker closes its end or dies.

**Not guaranteed.** No seccomp filter: a kernel exploit escapes. Jobs share the kernel's page cache
of the read-only system files (which pages of ``/usr`` are cached, set and read by any uid): a slow
side channel between jobs, and between the ranks of one job outside the grader's trace, that no
namespace closes (tests/grade.py runs every visible test before any hidden one because of it). p ranks may use p times
``limits.memory``. Processes of one job share ``limits.processes``. Without root (or a broker)
nothing runs. The student tree must be world-readable (the sandbox's uid reads it).
"""
import contextlib
import dataclasses
import functools
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tutorials.assignments import channel, replies, values

SANDBOX_UID = 65534                 # the uid of a plain run (tests' ``run``); every job gets one of its own:
SANDBOX_UIDS = range(1 << 20, 1 << 30)  # a job's uid, drawn afresh: nothing kept per uid (a keyring) is shared


def fresh_uid():
    """A uid for one sandboxed job, unused by any other: processes of one uid share kernel objects (the
    user keyring) that namespaces do not separate, so two jobs of one uid could talk past the grader."""
    import secrets
    return SANDBOX_UIDS.start + secrets.randbelow(len(SANDBOX_UIDS))
INSTALL = "apt-get install bubblewrap"
# No user namespace: bwrap run as root would map the sandbox uid back to root outside.
# The BLAS's settings pass in (OPENBLAS_CORETYPE picks the kernels): the same bits as the grader's.
BLAS_SETTINGS = ("OPENBLAS_", "MKL_", "OMP_", "NPY_")
NAMESPACES = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
DRIVER_FILES = ("sandbox_driver.py", "values.py", "codec.py", "replies.py", "channel.py", "proxy.py")
BROKER = "MINIDL_SANDBOX_BROKER"


class SandboxError(RuntimeError):
    """The sandboxed code gave no usable reply: timed out, crashed, raised, or replied with junk."""


@dataclasses.dataclass(frozen=True)
class Limits:
    memory: int = 3 << 30           # bytes of address space per process (RLIMIT_AS)
    processes: int = 512            # processes and threads of the sandbox uid (RLIMIT_NPROC)
    cpu: int = 300                  # CPU seconds per process (RLIMIT_CPU)
    file_size: int = 256 << 20      # the largest file a process may write (RLIMIT_FSIZE)
    tmp: int = 256 << 20            # bytes of the private /tmp, and of /dev/shm


@dataclasses.dataclass(frozen=True)
class Result:
    returncode: int
    timed_out: bool
    seconds: float
    output: str                     # the last few kB of stdout and stderr together


@functools.lru_cache(maxsize=None)
def _namespaces_work():
    return subprocess.run(["bwrap", *NAMESPACES, "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0


def why_not():
    """Why the sandbox cannot run here (with what to install or change), or None if it can."""
    if os.environ.get(BROKER) and os.geteuid() != 0:
        return None                                     # the grader's broker starts it
    return _local_why_not()


def _local_why_not():
    reasons = []
    if os.geteuid() != 0:
        reasons.append("the sandbox needs root (it drops to a uid of its own; bubblewrap as root makes no user "
                       "namespace)")
    if shutil.which("bwrap") is None:
        reasons.append(f"bubblewrap is not installed ({INSTALL})")
    elif not reasons and not _namespaces_work():
        reasons.append("bubblewrap cannot make namespaces here (a container that forbids them?)")
    return "; ".join(reasons) or None


def _drop(uid, limits):
    """Become ``uid`` with no capabilities, then set the limits (as that uid: NPROC binds it)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--inh-caps=-all",
            "--bounding-set=-all", "--", "prlimit", f"--as={limits.memory}", f"--nproc={limits.processes}",
            f"--cpu={limits.cpu}", f"--fsize={limits.file_size}", "--core=0", "--"]


def bwrap_arguments(binds, limits, chdir="/tmp"):
    """bubblewrap's arguments for a root made of /usr, the interpreter and ``binds`` ((source, target,
    how) each): the sandbox's, and the namespace that tests/grade.py runs the grader's tests in."""
    args = ["bwrap", *NAMESPACES, "--hostname", "sandbox", "--new-session", "--die-with-parent",
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--ro-bind", "/usr", "/usr"]
    covered = ["/usr"]                                  # read-only system folders, bound whole
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{name}"):
            args += ["--symlink", os.readlink(f"/{name}"), f"/{name}"]
        elif os.path.isdir(f"/{name}"):
            args += ["--ro-bind", f"/{name}", f"/{name}"]
            covered.append(f"/{name}")
    args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/sys", "/sys"]
    for place in ("/tmp", "/dev/shm"):
        args += ["--perms", "1777", "--size", str(limits.tmp), "--tmpfs", place]
    # the interpreter where it is named and where it really is (a virtual environment may be a link into
    # another folder, which a later bind of the tree that holds the link would otherwise leave unreachable)
    prefixes = {place for prefix in (sys.prefix, sys.base_prefix) for place in (prefix, os.path.realpath(prefix))}
    made, mounts = {"/", "/tmp", "/dev"}, [(prefix, prefix, "--ro-bind") for prefix in prefixes]
    for source, target, how in [*sorted(mounts), *binds]:
        if any(target == done or target.startswith(done + "/") for done in covered):
            continue                                    # e.g. an interpreter under /usr
        for parent in reversed(Path(target).parents):
            if str(parent) not in made:                 # bwrap would make it 0700: unreachable
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += [how, source, target]
        covered.append(target)
    return args + ["--chdir", chdir]


def _first_inside(info, deadline):
    """A pidfd of bwrap's first process inside (its PID namespace's init), from ``--info-fd``."""
    data = b""                                          # bwrap writes its JSON, then closes
    while select.select([info], [], [], max(0.0, deadline - time.monotonic()))[0] and (chunk := os.read(info, 4096)):
        data += chunk
    os.close(info)
    with contextlib.suppress(ValueError, KeyError, OSError):   # none if bwrap failed or the run is over
        return os.pidfd_open(json.loads(data)["child-pid"])


def _end(process, init):
    """SIGKILL what is left of a run and await the PID namespace's init, which ends last (bwrap does not)."""
    if init is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(init, signal.SIGKILL)
        select.select([init], [], [], 10)               # readable once it has exited
        os.close(init)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _driver_folder():
    """A world-readable folder of the driver and what it loads beside it (the student tree's copies never run)."""
    folder = Path(tempfile.mkdtemp(prefix="minidl-driver-"))
    os.chmod(folder, 0o755)
    for name in DRIVER_FILES:
        shutil.copyfile(Path(__file__).with_name(name), folder / name)
        os.chmod(folder / name, 0o644)
    return folder


def start(argv, tree, log, *, io=None, limits=Limits(), uid=None, pass_fds=(), timeout=30):
    """Start ``argv`` (``{tree}``, ``{io}``: those folders inside) in the sandbox: (process, init pidfd)."""
    why = _local_why_not()
    if why:
        raise SandboxError(f"the sandbox cannot run here: {why}")
    binds = [(str(Path(tree).resolve()), "/student", "--ro-bind")]
    binds += [] if io is None else [(str(io), "/io", "--ro-bind")]
    info, info_out = os.pipe()                          # bwrap tells the pid of its init there
    uid = fresh_uid() if uid is None else uid
    prefix = ["bwrap", "--info-fd", str(info_out), *bwrap_arguments(binds, limits)[1:], *_drop(uid, limits)]
    argv = [part.format(tree="/student", io="/io") for part in argv]
    blas = {name: value for name, value in os.environ.items() if name.startswith(BLAS_SETTINGS)}
    env = {**blas, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    process = subprocess.Popen([*prefix, *argv], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True, cwd="/", pass_fds=(info_out, *pass_fds))
    os.close(info_out)
    return process, _first_inside(info, time.monotonic() + timeout)


def run(argv, tree, timeout, *, limits=Limits(), uid=None):
    """Run ``argv`` in the sandbox (``{tree}`` becomes the tree's path there): a ``Result``; a timeout
    is reported there (``timed_out``), not raised."""
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        process, init = start(argv, tree, log, limits=limits, uid=fresh_uid() if uid is None else uid,
                              timeout=timeout)
        timed_out = False
        try:
            process.wait(timeout=max(0.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:                                        # done, timed out, or the grader interrupted
            _end(process, init)
        return Result(process.returncode, timed_out, time.monotonic() - started, _tail(log))


def _tail(log, size=4000):
    log.seek(max(0, log.seek(0, os.SEEK_END) - size))
    return log.read().decode(errors="replace")


class Job:
    """One sandboxed process of the student's tree (``serve``), or an ``mpiexec`` job of ``nprocs``
    ranks (``job``), that reads frames from one pipe and writes frames to another.

    ``send(arrays)`` writes a frame; ``receive(deadline)`` reads the next one (TimeoutError past
    the deadline, ``channel.Closed`` if the job ended); ``close()`` ends the job and everything it
    started. As root it starts the sandbox itself; else it asks the broker (``$MINIDL_SANDBOX_BROKER``).
    """

    def __init__(self, tree, mode="serve", nprocs=1, *, limits=Limits(), uid=None):
        if mode not in ("serve", "job") or not (isinstance(nprocs, int) and 1 <= nprocs <= 64) \
                or (mode == "serve" and nprocs != 1):
            raise ValueError(f"a sandboxed job of mode {mode!r} on {nprocs!r} ranks")
        self.mode, self.nprocs, self.process = mode, nprocs, None
        if os.environ.get(BROKER) and os.geteuid() != 0:
            self.to_job, self.from_job, self.control = _ask_broker(int(os.environ[BROKER]), mode, nprocs)
            self.log = None
            return
        self.control = None
        self.uid = fresh_uid() if uid is None else uid
        uid = self.uid
        self.folder = _driver_folder()
        self.log = tempfile.TemporaryFile()
        theirs_in, self.to_job = os.pipe()
        self.from_job, theirs_out = os.pipe()
        argv = [sys.executable, "-I", "-B", "{io}/sandbox_driver.py", "{tree}", mode, str(theirs_in), str(theirs_out)]
        if nprocs > 1:
            argv = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(nprocs), *argv]
        try:
            self.process, self.init = start(argv, tree, self.log, io=self.folder, limits=limits, uid=uid,
                                            pass_fds=(theirs_in, theirs_out))
        finally:
            os.close(theirs_in)
            os.close(theirs_out)

    def send(self, arrays):
        try:
            channel.write_frame(self.to_job, arrays)
        except (BrokenPipeError, OSError):
            raise channel.Closed("the sandboxed job ended before it took the call") from None

    def receive(self, deadline=None):
        return channel.read_frame(self.from_job, deadline)

    def output(self, size=1500):
        """The end of what the job printed (its tracebacks), where this side holds its log."""
        return _tail(self.log, size) if self.log is not None else ""

    def close(self):
        """End the job (and everything it started)."""
        for fd in (self.to_job, self.from_job):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.control is not None:
            self.control.close()                    # the broker kills the job
        if self.process is not None:
            _end(self.process, self.init)
            self.process = None
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.log is not None:
            self.log.close()
            self.log = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _ask_broker(fd, mode, nprocs):
    """(write end to the job, read end from it, control socket) from the grader's broker."""
    broker = socket.socket(fileno=os.dup(fd))
    try:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        socket.send_fds(broker, [json.dumps({"mode": mode, "nprocs": nprocs}).encode()], [theirs.fileno()])
        theirs.close()
        message, fds, _, _ = socket.recv_fds(mine, 4096, 2)
    finally:
        broker.close()
    answer = json.loads(message or b"{}")
    if len(fds) != 2 or not answer.get("ok"):
        for extra in fds:
            os.close(extra)
        mine.close()
        raise SandboxError(f"the grader's broker started no sandbox: {answer.get('error', 'no answer')}")
    return fds[0], fds[1], mine


def serve_broker(sock, tree, limits=Limits(), uid=None):
    """The broker (tests/grade.py, as root): start a sandboxed job of ``tree`` for each request on
    ``sock`` and hand back its pipes' ends; kill it once the asker's control socket closes. Until EOF."""
    import threading
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
        except OSError:
            return
        if not message and not fds:
            return
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            continue
        try:
            control = socket.socket(fileno=fds[0])
        except OSError:                             # not a socket: nothing to answer on
            os.close(fds[0])
            continue
        try:
            request = json.loads(message)
            job = Job(tree, str(request["mode"]), int(request["nprocs"]), limits=limits, uid=uid)
        except (ValueError, KeyError, TypeError, SandboxError, OSError) as error:
            with contextlib.suppress(OSError):
                control.send(json.dumps({"error": str(error)[:500]}).encode())
            control.close()
            continue
        if os.environ.get("MINIDL_BROKER_LOG"):
            with open(os.environ["MINIDL_BROKER_LOG"], "a") as log:
                log.write(f"{time.time():.3f} start {request} pid {job.process.pid} fds {job.to_job} {job.from_job}\n")
        try:
            socket.send_fds(control, [b'{"ok": true}'], [job.to_job, job.from_job])
        except OSError:                             # the asker is gone
            control.close()
            job.close()
            continue
        os.close(job.to_job)
        os.close(job.from_job)
        job.to_job = job.from_job = -1

        def watch(job=job, control=control):
            with contextlib.suppress(OSError):
                select.select([control], [], [])            # readable at EOF: the asker closed or died
            control.close()
            if os.environ.get("MINIDL_BROKER_LOG"):
                with open(os.environ["MINIDL_BROKER_LOG"], "a") as log:
                    log.write(f"{time.time():.3f} end pid {job.process.pid} output {job.output()[-300:]!r}\n")
            job.close()
        threading.Thread(target=watch, daemon=True).start()


# ---- one call, arrays in and out (the simple interface) ---------------------------------------------------

class Replies(dict):
    """{rank: {"return": value, <argument>: array it changed in place}}."""


def _arguments(args, nprocs):
    """One {name: value} per rank: ``args`` is one dict for every rank, or a list of nprocs dicts."""
    per_rank = [args or {}] * nprocs if args is None or isinstance(args, dict) else list(args)
    if not (isinstance(nprocs, int) and nprocs >= 1 and len(per_rank) == nprocs):
        raise ValueError(f"nprocs = {nprocs!r} with {len(per_rank)} dicts of args: want nprocs >= 1, one dict each")
    for name, value in [item for kwargs in per_rank for item in kwargs.items()]:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"args: {name!r} is not a Python identifier")
        if value is not None and (not isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, str))
                                  or np.asarray(value).dtype.hasobject):
            raise TypeError(f"args: {name} is a {type(value).__name__}: only arrays, numbers, strings and None")
    return [{name: (value.copy() if isinstance(value, np.ndarray) else value) for name, value in kwargs.items()}
            for kwargs in per_rank]


def failure_of(frame, nprocs, rank=None):
    """The message of an error frame: which rank raised what (``rank``: the caller's, for a worker of its
    own), and its traceback."""
    rank = int(frame.get("rank", 0)) if rank is None else rank
    return (f"rank {rank} of p = {nprocs} raised {str(frame.get('__error__', '?'))[:2000]}\n"
            f"{str(frame.get('__traceback__', ''))[-1500:]}")


def call(tree, module, function, args=None, nprocs=1, timeout=60, *, limits=Limits(), uid=None):
    """``module.function(**args)`` from the student ``tree`` in the sandbox: {rank: {name: value}}.

    ``args``: {name: array, number or string} for every rank, or a list of one such dict per rank.
    With ``nprocs`` > 1 the ranks run under ``mpiexec`` in the sandbox; a function that takes
    ``comm`` gets the sandbox's ``MPI.COMM_WORLD``. A rank's reply: ``return`` and each array
    argument the call changed in place, by name. ``SandboxError`` if a rank gives no such reply."""
    per_rank = _arguments(args, nprocs)
    frame, sent = {"__target__": np.array([module, function])}, []
    for rank, kwargs in enumerate(per_rank):
        arrays, things = values.pack_call(kwargs)
        sent.append(things)
        frame.update({f"r{rank}.{key}": array for key, array in {**arrays, "__target__": frame["__target__"]}.items()})
    del frame["__target__"]
    with Job(tree, "job", nprocs, limits=limits, uid=uid) as job:
        try:
            job.send(frame)
            reply = job.receive(time.monotonic() + timeout)
        except TimeoutError:
            why = "probably a send without a matching receive" if nprocs > 1 else "an endless loop or a wait"
            raise SandboxError(f"timed out after {timeout} s at p = {nprocs}: {why}\n{job.output()}") from None
        except channel.FrameError as error:
            raise SandboxError(f"{error} (p = {nprocs})\n{job.output()}") from None
    if "__error__" in reply:
        raise SandboxError(failure_of(reply, nprocs))
    out = Replies()
    for rank, kwargs in enumerate(per_rank):
        mine = {key.split(".", 1)[1]: array for key, array in reply.items() if key.startswith(f"r{rank}.")}
        before = {name: value.tobytes() for name, value in kwargs.items() if isinstance(value, np.ndarray)}
        try:
            result = replies.unpack_reply(mine, sent[rank])
        except ValueError as error:
            raise SandboxError(f"rank {rank}'s reply refused: {error}") from None
        out[rank] = {"return": result, **{name: kwargs[name] for name in before
                                          if kwargs[name].tobytes() != before[name]}}
    return out
