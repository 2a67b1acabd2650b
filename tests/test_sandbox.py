"""The grading sandbox, proved by attack: each test hands it a small hostile student module.

Every attack must end in a SandboxError or a harmless wrong reply, with the grader's side intact:
its files unchanged, no process of the sandbox uid left over, the call over in bounded time.
These tests need root and bubblewrap with namespaces (CI runs as root; .ci/run installs
bubblewrap where apt-get is available); elsewhere they skip, saying which of those is missing.
The fallback (setpriv mode) is tested as root with a uid of its own that no process uses.

    python -m pytest -q tests/test_sandbox.py        # about 20 s on 2 cores
"""
import dataclasses
import os
import shutil
import socket
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from collectives.model import cost
from tutorials.assignments import sandbox, values
from tutorials.assignments.sandbox import SandboxError

ROOT = Path(__file__).resolve().parent.parent


def _why_not():
    try:
        sandbox.mode("bwrap")
    except SandboxError as error:
        return str(error)
    return None


needs_bwrap = pytest.mark.skipif(_why_not() is not None, reason=f"no sandbox here: {_why_not()}")


def student(tmp_path, source):
    """A student tree holding ``attack.py`` (world-readable, as the sandbox uid needs it)."""
    tree = tmp_path / "tree"
    tree.mkdir(mode=0o755, exist_ok=True)
    (tree / "attack.py").write_text(textwrap.dedent(source))
    os.chmod(tree / "attack.py", 0o644)
    return tree


def processes_of(uid):
    """Pids of the live processes whose real uid is ``uid`` (zombies, killed but not yet reaped, are dead)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text() if entry.name.isdigit() else ""
            if status and status.split("Uid:")[1].split()[0] == str(uid) and "State:\tZ" not in status:
                pids.add(entry.name)
        except (OSError, IndexError):
            pass
    return pids


# --- the honest case -------------------------------------------------------------------------

@needs_bwrap
def test_an_honest_function_returns_its_arrays_and_what_it_changed_in_place(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        def scale(x, factor, label):
            assert isinstance(factor, int) and label == "twice"
            return x * factor, np.sum(x)
        def double_in_place(data, unchanged):
            data *= 2
    """)
    x = np.arange(5.0)
    reply = sandbox.call(tree, "attack", "scale", {"x": x, "factor": 2, "label": "twice"}, timeout=30)
    assert reply.mode == "bwrap" and reply.keys() == {0} and reply[0].keys() == {"return.0", "return.1"}
    np.testing.assert_array_equal(reply[0]["return.0"], 2 * x)
    assert reply[0]["return.1"] == 10.0
    reply = sandbox.call(tree, "attack", "double_in_place", {"data": x, "unchanged": x}, timeout=30)
    assert reply[0].keys() == {"data"}
    np.testing.assert_array_equal(reply[0]["data"], 2 * x)
    np.testing.assert_array_equal(x, np.arange(5.0))             # the caller's array is not touched


@needs_bwrap
def test_an_honest_mpi_function_on_3_ranks_sums_around_a_ring_of_point_to_point_messages(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        def ring_sum(comm, value):
            total, passing = value.copy(), value.copy()
            for _ in range(comm.size - 1):                       # pass each value once around
                incoming = np.empty_like(passing)
                comm.Sendrecv(passing, dest=(comm.rank + 1) % comm.size, recvbuf=incoming,
                              source=(comm.rank - 1) % comm.size)
                passing = incoming
                total += incoming
            return total
    """)
    values = [np.arange(4.0) * (rank + 1) for rank in range(3)]
    reply = sandbox.call(tree, "attack", "ring_sum", [{"value": value} for value in values], nprocs=3, timeout=60)
    for rank in range(3):
        np.testing.assert_array_equal(reply[rank]["return"], np.arange(4.0) * 6)


@needs_bwrap
def test_a_heart_of_this_repository_runs_in_the_sandbox_on_its_own_tree():
    from collectives.buffers import block_counts
    owner = np.repeat(np.arange(3), block_counts(7, 3))         # rank r owns block r of 7 numbers
    expected = 10.0 * owner + np.arange(7)
    data = [np.where(owner == rank, expected, -1.0) for rank in range(3)]
    reply = sandbox.call(ROOT, "collectives.ring", "ring_allgather_in_place", [{"data": d} for d in data],
                         nprocs=3, timeout=60)
    for rank in range(3):
        np.testing.assert_array_equal(reply[rank]["data"], expected)


@needs_bwrap
def test_run_drops_to_the_sandbox_uid_without_capabilities_in_bwrap_mode(tmp_path):
    result = sandbox.run(["cat", "/proc/self/status"], student(tmp_path, ""), 30)
    status = dict(line.split(":\t", 1) for line in result.output.splitlines() if ":\t" in line)
    assert (result.mode, result.returncode) == ("bwrap", 0)
    assert status["Uid"].split() == status["Gid"].split() == [str(sandbox.SANDBOX_UID)] * 4
    assert status["Groups"].strip() == "" and status["NoNewPrivs"] == "1"
    assert {status[name] for name in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0" * 16}


# --- attacks on the reply ---------------------------------------------------------------------

@needs_bwrap
def test_a_fake_reply_and_a_fake_result_file_then_exit_change_nothing(tmp_path):
    grades = tmp_path / "grades.json"
    grades.write_text('{"points": 0}')
    tree = student(tmp_path, """
        import glob, os, zipfile
        import numpy as np
        def forge(grades):
            for path in [grades, *glob.glob("/io/in/*"), "/io/in/driver.py"]:
                try:
                    with open(path, "w") as file:
                        file.write('{"points": 100}')
                except OSError:
                    pass
            with zipfile.ZipFile("/io/out/reply.0.npz", "w") as archive:   # a pickled object
                with archive.open("return.npy", "w") as entry:
                    np.lib.format.write_array(entry, np.array([print], dtype=object), allow_pickle=True)
            os._exit(0)
    """)
    with pytest.raises(SandboxError, match="not arrays.*object array"):
        sandbox.call(tree, "attack", "forge", {"grades": str(grades)}, timeout=30)
    assert grades.read_text() == '{"points": 0}'


@needs_bwrap
def test_monkeypatching_numpy_testing_and_pytest_does_not_reach_the_checks(tmp_path):
    tree = student(tmp_path, """
        import numpy as np, numpy.testing, pytest
        numpy.testing.assert_allclose = numpy.testing.assert_array_equal = lambda *args, **kwargs: None
        pytest.approx = lambda *args, **kwargs: True
        def answer(x):
            return np.zeros_like(x)                              # wrong
    """)
    x = np.arange(1.0, 4.0)
    reply = sandbox.call(tree, "attack", "answer", {"x": x}, timeout=30)
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(reply[0]["return"], 2 * x)
    assert reply[0]["return"].tolist() != pytest.approx((2 * x).tolist())


@needs_bwrap
@pytest.mark.parametrize("returned", ["AlwaysEqual()", "np.array([AlwaysEqual()], dtype=object)"])
def test_an_object_that_equals_anything_cannot_cross(tmp_path, returned):
    tree = student(tmp_path, f"""
        import numpy as np
        class AlwaysEqual:
            def __eq__(self, other):
                return True
        def answer():
            return {returned}
    """)
    with pytest.raises(SandboxError, match="only arrays, numbers and strings cross back"):
        sandbox.call(tree, "attack", "answer", timeout=30)


@needs_bwrap
@pytest.mark.parametrize("target", ["/etc/shadow", "answers.npz", "a pipe", "a folder"])
def test_a_reply_that_is_a_symlink_to_a_graders_file_a_pipe_or_a_folder_is_refused(tmp_path, target):
    answers = tmp_path / "answers.npz"
    np.savez(answers, **{"return": np.arange(3.0)})                # what a right answer would be
    target = str(answers) if target == "answers.npz" else target
    tree = student(tmp_path, """
        import os
        def link(target):
            reply = "/io/out/reply.0.npz"
            if target == "a pipe":
                os.mkfifo(reply)
            elif target == "a folder":
                os.mkdir(reply)
            else:
                os.symlink(target, reply)
            os._exit(0)
    """)
    with pytest.raises(SandboxError, match="not a regular file"):
        sandbox.call(tree, "attack", "link", {"target": target}, timeout=30)


@needs_bwrap
@pytest.mark.parametrize("forgery", ["bomb", "lying header", "too large"])
def test_a_reply_too_large_or_lying_about_its_size_is_refused(tmp_path, forgery):
    tree = student(tmp_path, """
        import io, os, zipfile
        import numpy as np
        def forge(forgery):
            if forgery == "too large":
                return np.zeros(1 << 18)                         # 2 MiB > the 1 MiB cap
            if forgery == "bomb":                                # 200 MB of zeros, deflated to a few hundred kB
                blob = io.BytesIO()
                np.lib.format.write_array(blob, np.zeros(25_000_000))
                data, how = blob.getvalue(), zipfile.ZIP_DEFLATED
            else:                                                # a header claiming 8 TB, then 8 bytes
                blob = io.BytesIO()
                np.lib.format.write_array(blob, np.zeros(1))
                data = blob.getvalue().replace(b"(1,), }", b"(1000000000000,), }").replace(b" " * 12 + b"\\n", b"\\n")
                how = zipfile.ZIP_STORED
            with zipfile.ZipFile("/io/out/reply.0.npz", "w", how) as archive:
                archive.writestr("return.npy", data)
            os._exit(0)
    """)
    match = {"bomb": "too large", "lying header": "does not match", "too large": "too large"}[forgery]
    with pytest.raises(SandboxError, match=match):
        sandbox.call(tree, "attack", "forge", {"forgery": forgery}, timeout=30, max_reply=1 << 20)


@needs_bwrap
@pytest.mark.parametrize("how, message", [
    ("os._exit(3)", "exited without a reply .exit status 3"),
    ("raise NotImplementedError('Task 3.4')", "raised NotImplementedError: Task 3.4")])
def test_a_function_that_dies_or_raises_gives_no_reply(tmp_path, how, message):
    tree = student(tmp_path, f"""
        import os
        def answer():
            {how}
    """)
    with pytest.raises(SandboxError, match=message):
        sandbox.call(tree, "attack", "answer", timeout=30)


@needs_bwrap
def test_one_rank_of_three_raising_ends_the_job_at_once_and_is_named(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        def answer(comm):
            if comm.rank == 1:
                raise ZeroDivisionError("rank 1 divides by zero")
            comm.recv(source=1)                                  # would wait forever without the abort
    """)
    started = time.perf_counter()
    with pytest.raises(SandboxError, match="rank 1 of p = 3 raised ZeroDivisionError: rank 1 divides"):
        sandbox.call(tree, "attack", "answer", nprocs=3, timeout=30)
    assert time.perf_counter() - started < 20


# --- attacks on the grader's machine ----------------------------------------------------------

@needs_bwrap
def test_a_forked_process_that_would_outlive_the_call_is_killed(tmp_path):
    tree = student(tmp_path, """
        import os, time
        import numpy as np
        def spawn():
            if os.fork() == 0:                                   # a daemon: new session, orphaned
                os.setsid()
                if os.fork() == 0:
                    time.sleep(600)
                os._exit(0)
            return np.array(1)
    """)
    before = processes_of(sandbox.SANDBOX_UID)
    assert sandbox.call(tree, "attack", "spawn", timeout=30)[0]["return"] == 1
    assert processes_of(sandbox.SANDBOX_UID) - before == set()


@needs_bwrap
def test_sleeping_forever_is_a_timeout_in_bounded_time(tmp_path):
    tree = student(tmp_path, """
        import time
        def answer():
            time.sleep(10**6)
    """)
    before, started = processes_of(sandbox.SANDBOX_UID), time.perf_counter()
    with pytest.raises(SandboxError, match=r"timed out after 3 s at p = 1"):
        sandbox.call(tree, "attack", "answer", timeout=3)
    assert time.perf_counter() - started < 15
    assert processes_of(sandbox.SANDBOX_UID) - before == set()


@needs_bwrap
def test_one_rank_of_five_deadlocked_is_a_timeout_that_names_p(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        def answer(comm):
            if comm.rank == 4:
                comm.recv(source=0)                              # rank 0 never sends
            return np.array(comm.rank)
    """)
    before, started = processes_of(sandbox.SANDBOX_UID), time.perf_counter()
    with pytest.raises(SandboxError, match=r"timed out after 6 s at p = 5: probably a send without"):
        sandbox.call(tree, "attack", "answer", nprocs=5, timeout=6)
    assert time.perf_counter() - started < 20
    assert processes_of(sandbox.SANDBOX_UID) - before == set()


@needs_bwrap
def test_allocating_20_gb_is_stopped_by_the_memory_limit(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        def answer():
            hog = np.ones(20 * 10**9 // 8)                       # touches every page
            return np.array(hog.nbytes)
    """)
    with pytest.raises(SandboxError, match="MemoryError"):
        sandbox.call(tree, "attack", "answer", timeout=30)


@needs_bwrap
def test_the_graders_checkout_is_not_visible(tmp_path):
    secret = tmp_path / "expected.npz"                          # the grader's own scratch
    np.savez(secret, answer=np.arange(3.0))
    paths = [ROOT / "tutorials" / "assignments" / "answers.md", ROOT / "tests" / "hidden",
             ROOT / "tests" / "test_sandbox.py", ROOT / "tutorials" / "assignments" / "tasks.toml", secret]
    assert all(path.exists() for path in paths if path.name != "hidden")     # there to be read, outside
    tree = student(tmp_path, """
        import os
        import numpy as np
        def peek(paths):
            for path in paths.split("\\n"):
                try:
                    os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
                    return np.array(1)
                except OSError:
                    pass
            return np.array(0)
    """)
    reply = sandbox.call(tree, "attack", "peek", {"paths": "\n".join(map(str, paths))}, timeout=30)
    assert reply[0]["return"] == 0


@needs_bwrap
def test_a_network_connection_to_the_host_fails(tmp_path):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        tree = student(tmp_path, """
            import socket
            import numpy as np
            def connect(port):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=3).close()
                    return np.array(1)
                except OSError:
                    return np.array(0)
        """)
        reply = sandbox.call(tree, "attack", "connect", {"port": listener.getsockname()[1]}, timeout=30)
        assert reply[0]["return"] == 0
        with pytest.raises(BlockingIOError):
            listener.accept()


# --- refusals ---------------------------------------------------------------------------------

def test_without_root_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxError, match="needs root"):
        sandbox.call(student(tmp_path, "def f():\n    return 1\n"), "attack", "f", timeout=5)


# --- the fallback: setpriv mode, a uid of its own and the limits, no namespaces --------------------

OWN_UID = 65533                                                 # unused here; setpriv mode kills its processes
needs_setpriv = pytest.mark.skipif(os.geteuid() != 0 or processes_of(OWN_UID) != set(),
                                   reason=f"setpriv mode needs root and a uid ({OWN_UID}) no process uses")


@pytest.fixture
def open_tree():
    """A student tree that any uid can read (setpriv mode binds nothing: it reads the host's paths)."""
    folder = Path(tempfile.mkdtemp(prefix="minidl-open-tree-"))
    os.chmod(folder, 0o755)
    (folder / "attack.py").write_text("import numpy as np\ndef answer(x):\n    return 2 * x\n")
    os.chmod(folder / "attack.py", 0o644)
    yield folder
    shutil.rmtree(folder)


@needs_setpriv
def test_setpriv_mode_refuses_the_shared_nobody_uid(open_tree):
    with pytest.raises(SandboxError, match="a uid of its own"):
        sandbox.run(["true"], open_tree, 5, wanted="setpriv")


@needs_setpriv
def test_setpriv_mode_runs_as_its_own_uid_and_leaves_no_process_behind(open_tree):
    result = sandbox.run(["id", "-u"], open_tree, 30, uid=OWN_UID, wanted="setpriv")
    assert (result.mode, result.returncode, result.output.strip()) == ("setpriv", 0, str(OWN_UID))
    daemon = "for i in $(seq 30); do setsid sleep 600 </dev/null >/dev/null 2>&1 & done; echo started"
    result = sandbox.run(["sh", "-c", daemon], open_tree, 30, uid=OWN_UID, wanted="setpriv")
    assert result.output.strip() == "started" and not result.timed_out
    assert processes_of(OWN_UID) == set()
    started = time.perf_counter()
    result = sandbox.run(["sleep", "600"], open_tree, 2, uid=OWN_UID, wanted="setpriv")
    assert result.timed_out and time.perf_counter() - started < 15
    assert processes_of(OWN_UID) == set()


@needs_setpriv
def test_setpriv_mode_calls_the_function_or_says_what_it_cannot_reach(open_tree):
    try:
        reply = sandbox.call(open_tree, "attack", "answer", {"x": np.arange(3.0)}, timeout=30, uid=OWN_UID,
                             wanted="setpriv")
    except SandboxError as error:                               # e.g. an interpreter under /root (0700)
        assert "cannot reach" in str(error) and not sandbox._reachable(sys.executable)
    else:
        assert reply.mode == "setpriv"
        np.testing.assert_array_equal(reply[0]["return"], [0.0, 2.0, 4.0])


def test_arguments_are_arrays_numbers_and_strings_only(tmp_path):
    with pytest.raises(TypeError, match="only arrays, numbers, strings and None"):
        sandbox.call(student(tmp_path, ""), "attack", "f", {"x": [1, 2]}, timeout=5)
    with pytest.raises(TypeError, match="only arrays, numbers, strings and None"):
        sandbox.call(student(tmp_path, ""), "attack", "f", {"x": np.array([None])}, timeout=5)


# ---- a session: one sandboxed job for many calls (the grader's proxy uses it) ------------------
COUNTER = """
    import time
    import numpy as np
    calls = 0

    def f(x):
        global calls
        calls += 1
        if x < 0:
            time.sleep(3600)                          # a call that never returns
        if x == 0:
            raise ValueError("x is 0")
        return np.array([calls, x])
"""


@needs_bwrap
def test_a_session_serves_many_calls_from_one_job_and_a_fresh_one_after_a_timeout(tmp_path):
    tree = student(tmp_path, COUNTER)
    with sandbox.Session(tree, "attack", "f") as session:
        counts = [int(session({"x": value}, timeout=30)[0]["return"][0]) for value in (5, 6, 7)]
        assert counts == [1, 2, 3], f"one job answers every call (its counter goes on): {counts}"
        with pytest.raises(sandbox.SandboxError, match="raised ValueError: x is 0"):
            session({"x": 0}, timeout=30)
        with pytest.raises(sandbox.SandboxError) as second:
            session({"x": 0}, timeout=30)
        said = str(second.value)                      # the call's own traceback, not the log of every call
        assert said.count("Traceback") == 1 and said.count("x is 0") == 3 and "in f\n" in said, said
        assert int(session({"x": 8}, timeout=30)[0]["return"][0]) == 6, "on one rank a raise leaves the job serving"
        started = time.perf_counter()
        with pytest.raises(sandbox.SandboxError, match="timed out after 2 s at p = 1"):
            session({"x": -1}, timeout=2)
        assert time.perf_counter() - started < 15, "the timeout ends the call in bounded time"
        assert processes_of(sandbox.SANDBOX_UID) == set(), "the timed-out job is gone"
        assert int(session({"x": 9}, timeout=30)[0]["return"][0]) == 1, "the next call gets a fresh job"
    assert processes_of(sandbox.SANDBOX_UID) == set(), "closing the session ends its job"


@needs_bwrap
def test_a_session_on_3_ranks_ends_its_job_when_a_rank_raises_and_starts_a_fresh_one(tmp_path):
    tree = student(tmp_path, """
        import numpy as np
        calls = 0

        def f(comm, x):
            global calls
            calls += 1
            if x == 0 and comm.Get_rank() == 1:
                raise ValueError("rank 1 gave up")
            total = np.zeros(1)
            comm.Allreduce(np.array([float(x)]), total)
            return np.array([calls, total[0]])
    """)
    with sandbox.Session(tree, "attack", "f", nprocs=3) as session:
        first = session([{"x": 1}, {"x": 2}, {"x": 3}], timeout=60)
        second = session([{"x": 1}, {"x": 1}, {"x": 1}], timeout=60)
        assert [list(first[rank]["return"]) for rank in range(3)] == [[1, 6]] * 3
        assert [list(second[rank]["return"]) for rank in range(3)] == [[2, 3]] * 3
        with pytest.raises(sandbox.SandboxError, match="rank 1 of p = 3 raised ValueError: rank 1 gave up"):
            session([{"x": 0}, {"x": 0}, {"x": 0}], timeout=60)
        again = session([{"x": 2}, {"x": 2}, {"x": 2}], timeout=60)
        assert [list(again[rank]["return"]) for rank in range(3)] == [[1, 6]] * 3, "a fresh job after the failure"


# --- plain values across the sandbox (tutorials/assignments/values.py) ------------------------

def test_plain_values_cross_exactly_and_a_generator_keeps_its_state():
    rng = np.random.default_rng(7)
    value = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "one": np.float32(0.5), "zero_d": np.array(3, np.int8),
             "shape": (2, 3), "big": 10 ** 30, "nan": float("nan"), "flags": [True, None, "gpipe"],
             "dtype": np.dtype("<f4"), "clocks": {0: 3, 1: 5}.values(), "steps": range(1, 9, 2),
             "cost": cost.RankCost(2, 16, 8), "rng": rng}
    back = values.unpack(values.pack(value))
    assert back["x"].dtype == np.float32 and back["x"].shape == (2, 3) and np.array_equal(back["x"], value["x"])
    assert type(back["one"]) is np.float32 and back["one"] == 0.5
    assert isinstance(back["zero_d"], np.ndarray) and back["zero_d"].dtype == np.int8 and back["zero_d"].shape == ()
    assert back["shape"] == (2, 3) and type(back["shape"]) is tuple and back["big"] == 10 ** 30
    assert np.isnan(back["nan"]) and back["flags"] == [True, None, "gpipe"] and back["dtype"] == np.float32
    assert type(back["clocks"]) is type({}.values()) and list(back["clocks"]) == [3, 5]
    assert back["steps"] == range(1, 9, 2) and back["cost"] == cost.RankCost(2, 16, 8)
    assert back["rng"].integers(1 << 30, size=4).tolist() == rng.integers(1 << 30, size=4).tolist()


@dataclasses.dataclass
class Outsider:
    """A dataclass outside the project's packages: a reply may not name it."""
    command: str


@pytest.mark.parametrize("spec, why", [
    ('["namedtuple", "inspect:FullArgSpec", [' + ", ".join(['["atom", null]'] * 7) + "]]", "not a namedtuple of the"),
    ('["dataclass", "tests.test_sandbox:Outsider", [["command", ["atom", "rm"]]]]', "not a dataclass of the"),
    ('["dataclass", "collectives.model.cost:RankCost", [["messages", ["int", "1"]]]]', "fields"),
    ('["array", "__values__"]', "not an array of the reply"),
    ('["array", "v7"]', "KeyError"),
    ('["generator", "{\\"bit_generator\\": \\"Evil\\"}"]', "not one of numpy's"),
    ('["dict", [[["list", []], ["atom", 1]]]]', "unhashable"),
    ('["int", "1' + "0" * 6000 + '"]', "kind 'int'"),
    ('["list", [' * 300 + "]]" * 300, "too deep"),
    ('["lambda", "print"]', "kind 'lambda'"),
    ("{", "JSONDecodeError")])
def test_a_crafted_reply_is_refused_piece_by_piece(spec, why):
    with pytest.raises(ValueError, match=why):
        values.unpack({"__values__": np.array(spec), "v0": np.zeros(2)})


def test_what_the_call_changed_in_place_is_copied_back_and_nothing_else():
    x, rng, shape = np.zeros(3), np.random.default_rng(1), [np.ones(2)]
    after_rng = np.random.default_rng(1)
    after_rng.random(5)
    values.copy_back({"x": x, "rng": rng, "shape": shape},
                     {"x": np.array([1.0, 2.0, 3.0]), "rng": after_rng, "shape": [np.full(2, 4.0)]})
    assert x.tolist() == [1.0, 2.0, 3.0] and shape[0].tolist() == [4.0, 4.0]
    assert rng.random() == np.random.default_rng(1).random(6)[5], "the generator is advanced as the sandbox's was"
    with pytest.raises(ValueError, match=r"came back as float32\[3\], was float64\[3\]"):
        values.copy_back(x, np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="came back as a str"):
        values.copy_back(x, "x")


@needs_bwrap
def test_a_session_carries_plain_values_both_ways(tmp_path):
    tree = student(tmp_path, """
        def f(x, shape, rng, clocks):
            x += 1
            return {"drawn": rng.integers(100), "shape": shape, "total": sum(clocks), "kind": type(clocks).__name__}
        """)
    x, rng = np.zeros(2, dtype=np.float32), np.random.default_rng(3)
    with sandbox.Session(tree, "attack", "f") as session:
        reply = session(values.pack({"x": x, "shape": (4, 5), "rng": rng, "clocks": {1: 2, 2: 5}.values()}), timeout=30)[0]
    out = values.unpack(dict(reply))
    values.copy_back({"x": x, "rng": rng}, {key: out["after"][key] for key in ("x", "rng")})
    assert out["return"] == {"drawn": np.random.default_rng(3).integers(100), "shape": (4, 5), "total": 7,
                             "kind": "dict_values"}
    assert x.tolist() == [1.0, 1.0] and rng.integers(100) == np.random.default_rng(3).integers(100, size=2)[1]


# --- project objects, functions and closures across the sandbox (values.py, codec.py) ----------------

def test_objects_cross_with_their_views_and_come_back_into_the_callers_own(tmp_path):
    from minidl.flat import FlatParameters
    from minidl.tensor import Parameter
    from tutorials.assignments import sandbox_driver

    def crossed(arrays):                                        # as a file, as the sandbox reads it
        sandbox_driver.save(str(tmp_path / "message.npz"), arrays)
        return sandbox_driver.load(str(tmp_path / "message.npz"))
    flat = FlatParameters([Parameter(np.zeros((2, 3))), Parameter(np.zeros(4))])
    arrays, sent = values.pack_call({"args": (flat,)})
    message, seen = values.unpack_call(crossed(arrays))         # what the sandbox gets
    theirs = message["args"][0]
    theirs.parameters[0].data += 1.0                            # through a view: the flat vector moves too
    assert theirs.data[:6].tolist() == [1.0] * 6 and theirs.data[6:].tolist() == [0.0] * 4
    values.unpack_reply(crossed(values.pack_reply(message, seen)), sent)
    assert flat.data[:6].tolist() == [1.0] * 6 and flat.parameters[0].data.base is flat.data, "in place, still a view"


@pytest.mark.parametrize("piece, why", [
    ('["object", 0, null, "subprocess:Popen", []]', "not a class of the project"),
    ('["object", 0, null, "tests.test_sandbox:Outsider", [["command", ["atom", "rm"]]]]', "not a class of the project"),
    ('["object", 0, null, "minidl.tensor:Tensor", [["backward", ["atom", 1]]]]', "not a plain name of its class"),
    ('["object", 0, null, "minidl.tensor:Tensor", [["__class__", ["atom", 1]]]]', "not a plain name of its class"),
    ('["function", "os", "system"]', "not a function or class of the project"),
    ('["function", "algorithms.serial_sgd", "main"]', "not a function or class of the project"),
    ('["closure", 0, null, "builtins", "eval.<locals>.f", 0, [], ["atom", null], ["atom", null]]', "does not have"),
    ('["partial", 0, null, ["function", "minidl.tensor", "matmul"], ["tuple", []], ["dict", [], 1, null]]', "partial"),
    ('["subcomm", 0, null, [0]]', "does not have"),
    ('["object", 0, 2, "minidl.tensor:Tensor", []]', "not one of its or not that kind")])
def test_a_reply_that_names_a_class_function_or_field_outside_the_project_is_refused_and_changes_nothing(piece, why):
    from minidl.tensor import Tensor
    mine = Tensor(np.zeros(3))
    arrays, sent = values.pack_call({"args": (mine, [np.ones(2)])})
    assert sent[1] is mine and sent[2] is mine.data
    # a reply that first gives the caller's Tensor new values, then holds the forged piece
    forged = ('["tuple", [["object", 0, 1, "minidl.tensor:Tensor", [["data", ["array", "v0", 1, null]]]], '
              + piece.replace('", 0, ', '", 9, ', 1) + "]]")
    with pytest.raises(ValueError, match=why):
        values.unpack_reply({"__values__": np.array(forged), "v0": np.full(3, 7.0)}, sent)
    assert np.array_equal(mine.data, np.zeros(3)) and type(mine.data) is np.ndarray, "nothing was written"


def test_an_object_whose_method_is_replaced_cannot_make_the_grader_run_its_code():
    from minidl.tensor import Tensor
    bad = Tensor(np.zeros(2))
    bad.backward = print                                         # the sandbox's side could try this
    with pytest.raises(TypeError, match="shadows its class's backward"):
        values.pack(bad)
    crafted = '["object", 0, null, "minidl.tensor:Tensor", [["numpy", ["function", "minidl.tensor", "matmul"]]]]'
    with pytest.raises(ValueError, match="not a plain name of its class"):
        values.unpack({"__values__": np.array(crafted)})
    # a closure comes back only as this side's own code of that name; the task's own as a stand-in
    remote = values.unpack_reply({"__values__": np.array('["closure", 0, null, "minidl.functional", '
                                                         '"copy_to_parallel.<locals>.<lambda>", 0, [], '
                                                         '["atom", null], ["atom", null]]')}, {},
                                 remote=("minidl.functional", "copy_to_parallel"))
    assert isinstance(remote, values.Remote)
    with pytest.raises(RuntimeError, match="only be called in the sandbox"):
        remote(np.zeros(2))
