"""A sandbox for untrusted student code: arrays in, one function (or an MPI job of them), arrays out.

    from tutorials.assignments import sandbox          # as root, with bubblewrap installed
    reply = sandbox.call("hw3", "collectives.ring", "ring_allgather_in_place",
                         [{"data": x0}, {"data": x1}, {"data": x2}], nprocs=3, timeout=30)
    reply[2]["data"], reply.mode        # rank 2's `data` after the call ("return": what it returned)
    sandbox.run(["id", "-u"], "hw3", timeout=10).output         # any command: a Result, with its mode

The grader's checks and answers stay in its own process; the student's function runs elsewhere
and can influence only the arrays it hands back. tests/test_sandbox.py attacks it.

**Mode "bwrap"** (root, ``apt-get install bubblewrap``, namespaces allowed): its own network
(loopback only), PID, IPC and hostname namespaces, a new session, death with its parent; setpriv
drops root for ``uid`` (65534) without capabilities or new privileges. It sees only the student
tree (read-only, ``/student``), the interpreter (``sys.prefix``, ``sys.base_prefix``), ``/usr``,
``/sys`` (all read-only), its own ``/proc`` and ``/dev``, a private ``/tmp`` and ``/dev/shm``
(MPICH needs it), and for ``call`` its arguments (``/io/in``, read-only) and an empty reply
folder (``/io/out``): nothing else of the grader's checkout (tests, hidden tests, answers).
``Limits`` per process (``prlimit``): address space (3 GiB), processes of the uid, CPU seconds,
file size, no core files. After the wall-clock ``timeout`` the whole PID namespace is killed; a
call returns once it is gone (forked daemons included). Replies are opened with ``lstat`` and
``O_NOFOLLOW`` (no symlinks, pipes or folders), capped in size (packed and unpacked), and parsed
as .npy entries whose header must match their size and hold no objects (never pickle).

**Mode "setpriv"** (root, namespaces refused): only the uid and the limits separate the code from
the grader. It sees every world-readable file and has the network, so hide the grader's checkout
(0700) and give it a uid of its own (every process of that uid is killed after each run).

**Not guaranteed.** No seccomp filter: a kernel exploit escapes. p ranks may use p times
``limits.memory``. Within the timeout a submission can fill the grader's disk with reply-folder
files of up to ``limits.file_size``. Processes of one uid share ``limits.processes``. Without
root nothing runs. The student tree must be world-readable (the sandbox uid reads it).
"""
import contextlib
import dataclasses
import functools
import io
import json
import math
import os
import re
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from tutorials.assignments import sandbox_driver, values

SANDBOX_UID = 65534
# No user namespace: bwrap run as root would map the sandbox uid back to root outside.
# The BLAS's settings pass in (OPENBLAS_CORETYPE picks the kernels): the same bits as the grader's.
BLAS_SETTINGS = ("OPENBLAS_", "MKL_", "OMP_", "NPY_")
NAMESPACES = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]


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
    mode: str                       # "bwrap" or "setpriv"
    returncode: int
    timed_out: bool
    seconds: float
    output: str                     # the last few kB of stdout and stderr together


class Replies(dict):
    """{rank: {name: array}}, and the ``mode`` that ran them."""
    mode = None


@functools.lru_cache(maxsize=None)
def _bwrap_works():
    return bool(shutil.which("bwrap")) and subprocess.run(
        ["bwrap", *NAMESPACES, "--ro-bind", "/", "/", "true"], capture_output=True).returncode == 0


def mode(wanted=None):
    """The mode a run gets: "bwrap" where bubblewrap and namespaces work, else "setpriv"."""
    if os.geteuid() != 0:
        raise SandboxError("the sandbox needs root (to drop to its own uid): run the grader as root")
    if wanted in (None, "bwrap") and _bwrap_works():
        return "bwrap"
    if wanted == "bwrap":
        raise SandboxError("bwrap mode: bubblewrap is missing or namespaces are not allowed here")
    if shutil.which("setpriv") and shutil.which("prlimit"):
        return "setpriv"
    raise SandboxError("neither bubblewrap with namespaces nor setpriv and prlimit are available")


def _drop(uid, limits):
    """Become ``uid`` with no capabilities, then set the limits (as that uid: NPROC binds it)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--inh-caps=-all",
            "--bounding-set=-all", "--", "prlimit", f"--as={limits.memory}", f"--nproc={limits.processes}",
            f"--cpu={limits.cpu}", f"--fsize={limits.file_size}", "--core=0", "--"]


def _bwrap(tree, binds, limits):
    """bubblewrap's arguments: a root made of /usr, the interpreter, the tree and ``binds``."""
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
    made, mounts = {"/", "/tmp", "/dev"}, [(prefix, prefix, "--ro-bind") for prefix in {sys.prefix, sys.base_prefix}]
    for source, target, how in [*sorted(mounts), (str(tree), "/student", "--ro-bind"), *binds]:
        if any(target == done or target.startswith(done + "/") for done in covered):
            continue                                    # e.g. an interpreter under /usr
        for parent in reversed(Path(target).parents):
            if str(parent) not in made:                 # bwrap would make it 0700: unreachable
                args += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        args += [how, source, target]
        covered.append(target)
    return args + ["--chdir", "/tmp"]


def _reachable(path):
    """Whether a uid that is neither owner nor in the group can read ``path`` (and its target)."""
    return all(all(os.stat(folder).st_mode & stat.S_IXOTH for folder in Path(place).parents)
               and os.stat(place).st_mode & stat.S_IROTH for place in (Path(path).absolute(), Path(path).resolve()))


def _sweep(uid):
    """setpriv mode: SIGKILL every process of ``uid`` (kill -1 as that uid) until none is alive."""
    for _ in range(100):
        subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "kill", "-9", "-1"],
                       capture_output=True)
        if not any(_alive(status, uid) for status in Path("/proc").glob("[0-9]*/status")):
            return
        time.sleep(0.05)


def _alive(status, uid):
    with contextlib.suppress(OSError):                  # it may have just gone
        text = status.read_text()
        return f"\nUid:\t{uid}\t" in text and "\nState:\tZ" not in text
    return False


def _first_inside(info, deadline):
    """A pidfd of bwrap's first process inside (its PID namespace's init), from ``--info-fd``."""
    data = b""                                          # bwrap writes its JSON, then closes
    while select.select([info], [], [], max(0.0, deadline - time.perf_counter()))[0] and (chunk := os.read(info, 4096)):
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


def _start(argv, tree, timeout, io_dir, limits, uid, wanted, env, log):
    """Start ``argv`` in the sandbox, its output to ``log``: (process, init pidfd or None, mode, started)."""
    chosen = mode(wanted)
    tree = Path(tree).resolve()
    info = info_out = None
    if chosen == "bwrap":
        binds = [] if io_dir is None else [(str(Path(io_dir) / "in"), "/io/in", "--ro-bind"),
                                           (str(Path(io_dir) / "out"), "/io/out", "--bind")]
        places = {"tree": "/student", "io": "/io"}
        info, info_out = os.pipe()                      # bwrap tells the pid of its init there
        prefix = ["bwrap", "--info-fd", str(info_out), *_bwrap(tree, binds, limits)[1:], *_drop(uid, limits)]
    else:
        if uid == SANDBOX_UID:
            raise SandboxError(f"setpriv mode kills every process of its uid: give it a uid of its own, not {uid}")
        program = shutil.which(argv[0], path=f"{Path(sys.executable).parent}:/usr/bin:/bin") or argv[0]
        for path in [program, tree] + ([] if io_dir is None else [Path(io_dir) / "in"]):
            if not _reachable(path):
                raise SandboxError(f"setpriv mode: uid {uid} cannot reach {path}; bwrap mode would bind it")
        places = {"tree": str(tree), "io": str(io_dir)}
        prefix = _drop(uid, limits)
    argv = [part.format(**places) for part in argv]
    blas = {name: value for name, value in os.environ.items() if name.startswith(BLAS_SETTINGS)}
    env = {**blas, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
    started = time.perf_counter()
    process = subprocess.Popen([*prefix, *argv], stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, env=env, start_new_session=True,
                               cwd="/" if info else str(tree), pass_fds=(info_out,) if info else ())
    init = None
    if info:
        os.close(info_out)
        init = _first_inside(info, started + timeout)
    return process, init, chosen, started


def _stop(process, init, chosen, uid):
    """End a run and everything it started (the PID namespace; setpriv mode: every process of uid)."""
    _end(process, init)
    if chosen == "setpriv":
        _sweep(uid)


def _where(reply):
    """The traceback a reply that raised carries (the call's own frames), or ''."""
    return str(reply.get("__traceback__", ""))[-1500:]


def _tail(log, size=4000):
    log.seek(max(0, log.seek(0, os.SEEK_END) - size))
    return log.read().decode(errors="replace")


def run(argv, tree, timeout, *, io_dir=None, limits=Limits(), uid=SANDBOX_UID, wanted=None, env=None):
    """Run ``argv`` in the sandbox; ``{tree}`` and ``{io}`` in it become those folders' paths there.

    ``io_dir`` (optional) holds ``in/`` (bound read-only at /io/in) and ``out/`` (writable, at
    /io/out). Returns a ``Result``; a timeout is reported there (``timed_out``), not raised."""
    with tempfile.TemporaryFile() as log:
        process, init, chosen, started = _start(argv, tree, timeout, io_dir, limits, uid, wanted, env, log)
        timed_out = False
        try:
            process.wait(timeout=max(0.0, started + timeout - time.perf_counter()))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:                                        # done, timed out, or the grader interrupted
            _stop(process, init, chosen, uid)
        return Result(chosen, process.returncode, timed_out, time.perf_counter() - started, _tail(log))


def _arguments(args, nprocs):
    """One {name: array} per rank: ``args`` is one dict for every rank, or a list of nprocs dicts."""
    per_rank = [args or {}] * nprocs if args is None or isinstance(args, dict) else list(args)
    if not (isinstance(nprocs, int) and nprocs >= 1 and len(per_rank) == nprocs):
        raise ValueError(f"nprocs = {nprocs!r} with {len(per_rank)} dicts of args: want nprocs >= 1, one dict each")
    for name, value in [item for kwargs in per_rank for item in kwargs.items()]:
        if not (isinstance(name, str) and name.isidentifier()):
            raise ValueError(f"args: {name!r} is not a Python identifier")
        if value is not None and (not isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, str))
                                  or np.asarray(value).dtype.hasobject):
            raise TypeError(f"args: {name} is a {type(value).__name__}: only arrays, numbers, strings and None")
    encoded = []
    for kwargs in per_rank:
        arrays = {name: np.asarray(value) for name, value in kwargs.items() if value is not None}
        nones = [name for name, value in kwargs.items() if value is None]
        encoded.append({**arrays, "__none__": np.array(nones, dtype=str)} if nones else arrays)
    return encoded


def _copy_driver(folder):
    """The driver and the codec it packs values with, readable inside the sandbox (the student's tree
    need not have them)."""
    for source, name in ((sandbox_driver.__file__, "driver.py"), (values.__file__, "values.py"),
                         (values.codec.__file__, "codec.py")):
        shutil.copyfile(source, folder / name)
        os.chmod(folder / name, 0o644)


def _parse_npy(blob):
    """An array from .npy bytes, after checking that the header is sane and matches the data."""
    stream = io.BytesIO(blob)
    version = np.lib.format.read_magic(stream)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f".npy version {version}")
    shape, _, dtype = getattr(np.lib.format, f"read_array_header_{version[0]}_0")(stream)
    if dtype.hasobject:
        raise ValueError("an object array (that would need pickle)")
    if dtype.itemsize * math.prod(shape) != len(blob) - stream.tell():
        raise ValueError("the header's shape does not match the data")
    stream.seek(0)
    return np.lib.format.read_array(stream, allow_pickle=False)


def _read_reply(folder, rank, cap):
    """{name: array} from ``folder``/reply.<rank>.npz, or None if there is none. Never follows links.
    (``rank`` may be "K.<rank>": a session's call K.)"""
    name = f"reply.{rank}.npz"
    try:
        info = os.lstat(name, dir_fd=folder)
    except FileNotFoundError:
        return None
    refused = SandboxError(f"rank {rank}'s reply is not a regular file (a symlink, folder or pipe): refused")
    if not stat.S_ISREG(info.st_mode):
        raise refused
    if info.st_size > cap:
        raise SandboxError(f"rank {rank}'s reply too large ({info.st_size} bytes > {cap})")
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except OSError:
        raise refused from None
    if not stat.S_ISREG(os.fstat(handle).st_mode):     # before fdopen, which refuses folders itself
        os.close(handle)
        raise refused
    with os.fdopen(handle, "rb") as file:
        data = file.read(cap + 1)
    arrays, budget = {}, cap
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for entry in archive.infolist():
                key = entry.filename.removesuffix(".npy")
                if key == entry.filename or not re.fullmatch(r"[A-Za-z_][\w.]*", key, re.ASCII) \
                        or key in arrays or len(arrays) == 1000:
                    raise ValueError(f"an entry named {entry.filename[:80]!r} (or the 1001st)")
                with archive.open(entry) as stream:
                    blob = stream.read(budget + 1)      # decompressed: the header's sizes are claims
                budget -= len(blob)
                if budget < 0:
                    raise SandboxError(f"rank {rank}'s reply too large (over {cap} bytes unpacked)")
                arrays[key] = _parse_npy(blob)
    except SandboxError:
        raise
    except Exception as error:                          # whatever a crafted file makes numpy or zipfile say
        raise SandboxError(f"rank {rank}'s reply is not arrays ({type(error).__name__}: {error}): refused") from None
    return arrays


def call(tree, module, function, args=None, nprocs=1, timeout=60, *, limits=Limits(), uid=SANDBOX_UID,
         wanted=None, max_reply=64 << 20):
    """``module.function(**args)`` from the student ``tree`` in the sandbox: {rank: {name: array}}.

    ``args``: {name: array, number or string} for every rank, or a list of one such dict per rank
    (0-d arrays arrive as Python scalars). With ``nprocs`` > 1 the ranks run under ``mpiexec`` in
    the sandbox; a function that takes ``comm`` gets ``MPI.COMM_WORLD``. A rank's reply: ``return``
    (a tuple as ``return.0``, ...; a dict as ``return.<key>``) and each array argument changed in
    place, by name; ``.mode`` says which mode ran. ``SandboxError`` if a rank gives no such reply."""
    per_rank = _arguments(args, nprocs)
    with tempfile.TemporaryDirectory(prefix="minidl-sandbox-") as work:
        work = Path(work)
        os.chmod(work, 0o711)                           # setpriv mode: the uid may pass, not list
        (work / "in").mkdir(mode=0o755)
        (work / "out").mkdir(mode=0o700)
        os.chown(work / "out", uid, uid)
        for rank, arrays in enumerate(per_rank):
            sandbox_driver.save(str(work / "in" / f"args.{rank}.npz"), arrays)
        _copy_driver(work / "in")
        for path in (work / "in").iterdir():
            os.chmod(path, 0o644)
        argv = [sys.executable, "-I", "-B", "{io}/in/driver.py", "{tree}", "{io}", module, function, str(nprocs)]
        if nprocs > 1:
            argv = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(nprocs), *argv]
        result = run(argv, tree, timeout, io_dir=work, limits=limits, uid=uid, wanted=wanted)
        tail = result.output[-1500:].strip()
        if result.timed_out:
            why = "probably a send without a matching receive" if nprocs > 1 else "an endless loop or a wait"
            raise SandboxError(f"timed out after {timeout} s at p = {nprocs}: {why}\n{tail}")
        folder = os.open(work / "out", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            replies = Replies((rank, _read_reply(folder, rank, max_reply)) for rank in range(nprocs))
            replies.mode = result.mode
        finally:
            os.close(folder)
    for rank, reply in sorted(replies.items(), key=lambda item: item[1] is None):     # why first
        if reply is None:
            raise SandboxError(f"rank {rank} of p = {nprocs} exited without a reply (exit status "
                               f"{result.returncode}, mode {result.mode})\n{tail}")
        if "__error__" in reply:
            raise SandboxError(f"rank {rank} of p = {nprocs} raised {str(reply['__error__'])[:2000]}\n"
                               f"{_where(reply) or tail}")
    return replies


class _Serving(SandboxError):
    """A one-rank call raised, and the job is still serving (the session stays open)."""


class Session:
    """One sandboxed job kept for many calls of ``module.function`` on ``nprocs`` ranks.

        with sandbox.Session(tree, "collectives.ring", "ring_allgather_in_place", nprocs=3) as ring:
            replies = ring([{"data": x0}, {"data": x1}, {"data": x2}], timeout=30)

    Starting a sandbox and ``mpiexec`` costs about a second; a call on a running session costs
    milliseconds. Each call writes ``in/args.K.<rank>.npz`` and waits for every rank's
    ``out/reply.K.<rank>.npz`` (read as ``call`` reads replies). A call that times out, a rank
    that raises or a job that dies raises ``SandboxError``. On one rank an exception leaves the
    job serving; otherwise the session ends and the next call starts a fresh one, so one bad call
    costs one timeout (or a restart, about a second) and the later calls nothing.
    """

    def __init__(self, tree, module, function, nprocs=1, *, limits=Limits(), uid=SANDBOX_UID, wanted=None,
                 max_reply=64 << 20):
        self.tree, self.module, self.function, self.nprocs = tree, module, function, nprocs
        self.limits, self.uid, self.wanted, self.max_reply = limits, uid, wanted, max_reply
        self.job = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _open(self, timeout):
        work = Path(tempfile.mkdtemp(prefix="minidl-session-"))
        os.chmod(work, 0o711)
        (work / "in").mkdir(mode=0o755)
        (work / "out").mkdir(mode=0o700)
        os.chown(work / "out", self.uid, self.uid)
        _copy_driver(work / "in")
        argv = [sys.executable, "-I", "-B", "{io}/in/driver.py", "{tree}", "{io}", self.module, self.function,
                str(self.nprocs), "serve"]
        if self.nprocs > 1:
            argv = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(self.nprocs), *argv]
        log = tempfile.TemporaryFile()
        try:
            process, init, chosen, _ = _start(argv, self.tree, timeout, work, self.limits, self.uid, self.wanted,
                                              None, log)
        except BaseException:
            log.close()
            shutil.rmtree(work, ignore_errors=True)
            raise
        self.job = {"work": work, "log": log, "process": process, "init": init, "mode": chosen, "number": 0}

    def close(self):
        """End the job (and everything it started) and remove its folder."""
        job, self.job = self.job, None
        if job is not None:
            _stop(job["process"], job["init"], job["mode"], self.uid)
            job["log"].close()
            shutil.rmtree(job["work"], ignore_errors=True)

    def _forget(self, folder, number):
        """Remove call ``number``'s files: its replies and its arguments."""
        for rank in range(self.nprocs):
            with contextlib.suppress(OSError):
                os.unlink(f"reply.{number}.{rank}.npz", dir_fd=folder)
            (self.job["work"] / "in" / f"args.{number}.{rank}.npz").unlink(missing_ok=True)

    def __call__(self, args=None, timeout=60):
        """{rank: {name: array}} of one call, as ``call`` returns it."""
        per_rank = _arguments(args, self.nprocs)
        if self.job is None:
            self._open(timeout)
        job = self.job
        number, work = job["number"], job["work"]
        job["number"] += 1
        for rank, arrays in enumerate(per_rank):
            part = work / "in" / f".args.{number}.{rank}.npz"
            sandbox_driver.save(str(part), arrays)
            os.chmod(part, 0o644)
            os.replace(part, work / "in" / f"args.{number}.{rank}.npz")
        deadline, replies = time.perf_counter() + timeout, Replies()
        replies.mode = job["mode"]
        folder = os.open(work / "out", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            pause = 0.0005
            while len(replies) < self.nprocs:
                for rank in range(self.nprocs):
                    if rank not in replies:
                        reply = _read_reply(folder, f"{number}.{rank}", self.max_reply)
                        if reply is not None:
                            replies[rank] = reply
                            if "__error__" in reply:
                                where = _where(reply) or _tail(job["log"], 1500)
                                if self.nprocs == 1 and job["process"].poll() is None:
                                    self._forget(folder, number)     # the job serves on
                                    raise _Serving(f"rank 0 of p = 1 raised {str(reply['__error__'])[:2000]}\n{where}")
                                raise SandboxError(f"rank {rank} of p = {self.nprocs} raised "
                                                   f"{str(reply['__error__'])[:2000]}\n{where}")
                if len(replies) == self.nprocs:
                    self._forget(folder, number)
                    break
                if job["process"].poll() is not None:
                    raise SandboxError(f"the job ended (exit status {job['process'].returncode}) before every "
                                       f"rank of p = {self.nprocs} replied\n{_tail(job['log'], 1500)}")
                if time.perf_counter() > deadline:
                    why = "probably a send without a matching receive" if self.nprocs > 1 else "an endless loop or a wait"
                    raise SandboxError(f"timed out after {timeout} s at p = {self.nprocs}: {why}\n"
                                       f"{_tail(job['log'], 1500)}")
                time.sleep(pause)
                pause = min(2 * pause, 0.001)
        except _Serving as error:
            raise SandboxError(str(error)) from None
        except BaseException:
            self.close()                                # a fresh job for the next call
            raise
        finally:
            os.close(folder)
        return replies
