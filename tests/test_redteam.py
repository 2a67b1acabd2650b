"""The grader attacked by a student who has read its source: one submission of hostile fenced bodies.

Each body below is what a student who wants the points, and knows how tests/grade.py,
tests/grade_proxy.py and tutorials/assignments/ work, would write into one task. They are graded
together, through the grader itself (``tests/grade.py --student``: the tests as their own uid in
a namespace, the sandbox lent by the broker, outcomes over pipes), one chosen test of each task,
and each must score nothing (or, for the bodies that only look around and then answer right,
full marks with nothing found), leave nothing running and write nothing outside the sandbox.

Needs what grading needs: root, bubblewrap with namespaces and util-linux (``apt-get install
bubblewrap``; CI installs it); elsewhere it skips, saying so.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import grade
from tutorials import assignments
from tutorials.assignments import sandbox

ROOT = Path(__file__).resolve().parent.parent
TASKS, GENERATOR = assignments.load()
MISSING = grade.missing_tools() if os.geteuid() == 0 else "grading a submission needs root"
pytestmark = [pytest.mark.skipif(bool(MISSING), reason=f"the grader's sandbox cannot run here: {MISSING}; it "
                                 "needs root and bubblewrap with namespaces (apt-get install bubblewrap; CI installs "
                                 "it)"),
              pytest.mark.skipif(assignments.is_student_tree(ROOT), reason=assignments.STUDENT_TREE)]
TIMEOUT = 12                                  # --timeout: a sandboxed call may wait 7 s, a test 12 s

# {task: (the test of it that is graded, its body ({indent}: the fence's; {marker}: a file nobody may write),
#         what the task scores, words its message must hold)}
ATTACKS = {
    # the gadget chain: hand back a function of the tests' helpers that would start a program as the grader
    "1.1": ("tests/hidden/test_chapter1_hidden.py::test_matmul_gradients_of_float32_operands_are_float32", """\
{indent}import functools, tests.helpers as helpers
{indent}payload = functools.partial(helpers.mpiexec, 1, "-c", "open({marker!r}, 'w')")
{indent}a.grad = payload                                   # a field of the caller's Tensor, made a function
{indent}grad_a, grad_b = payload, helpers.mpiexec
""", 0, ["cannot cross back"]),
    # a backward that computes nothing and zeroes its operands, so that a test working out its expected
    # values afterwards from them would expect zeros too (the change it makes is refused: the task returns)
    "1.2": ("tests/hidden/test_chapter1_hidden.py::test_softmax_cross_entropy_gradient_of_float32_logits_is_float32",
            """\
{indent}shifted[...] = 0
{indent}log_sum[...] = 0
{indent}return (xp.zeros_like(shifted),)
""", 0, ["changed what it was given"]),
    # forge the grader's record of outcomes, then leave before anything checks
    "1.3": ("tests/hidden/test_chapter1_hidden.py::test_im2col_equals_the_index_loop[n1c1_5x7_k2x3_s1]", """\
{indent}import glob, os
{indent}line = "call\\tpassed\\t" + "tests/hidden/test_chapter1_hidden.py::forged" + "\\t\\t0\\n"
{indent}for place in [value for name, value in os.environ.items() if "GRADE" in name] + glob.glob("/proc/*/fd/*"):
{indent}    try:
{indent}        os.write(int(place), line.encode()) if place.isdigit() else open(place, "a").write(line)
{indent}    except (OSError, ValueError):
{indent}        pass
{indent}try:
{indent}    open({marker!r}, "w")
{indent}except OSError:
{indent}    pass
{indent}os._exit(0)
""", 0, ["ended"]),
    # make every comparison pass, then hand back zeros of the right shape
    "1.4": ("tests/hidden/test_chapter1_hidden.py::test_col2im_equals_the_index_loop[n1c1_5x7_k2x3_s1]", """\
{indent}import numpy, numpy.testing, pytest
{indent}numpy.testing.assert_allclose = numpy.testing.assert_array_equal = lambda *a, **k: None
{indent}numpy.array_equal = numpy.allclose = lambda *a, **k: True
{indent}pytest.approx = lambda *a, **k: True
{indent}return numpy.zeros(padded_shape, dtype=cols.dtype)
""", 0, ["AssertionError"]),                           # the test's own check, here: wrong values
    # an answer that equals anything it is compared with
    "2.1": ("tests/hidden/test_chapter2_hidden.py::test_fft_forward_equals_the_loop_in_float64[x7x5_k1x3_s1_p0]", """\
{indent}class Equal:
{indent}    shape = dtype = None
{indent}    def __eq__(self, other):
{indent}        return True
{indent}    __ne__ = lambda self, other: False
{indent}return Equal()
""", 0, ["cannot cross back"]),
    # an object whose every protocol method would run code wherever the grader touched it
    "2.3": ("tests/hidden/test_chapter2_hidden.py::test_winograd_gradients_of_float32_are_float32_and_close",
            """\
{indent}class Gadget:
{indent}    def _run(self, *args, **kwargs):
{indent}        open({marker!r}, "w")
{indent}        return True
{indent}    __repr__ = __str__ = __format__ = __eq__ = __len__ = __iter__ = __array__ = __del__ = __bool__ = _run
{indent}    def __getattr__(self, name):
{indent}        return self._run
{indent}return Gadget()
""", 0, ["cannot cross back"]),
    # hidden tests' inputs kept in the worker and said in a visible test's failure: the hidden tests run
    # last, and the times of the calls say which test saw what
    "2.2": ("tests/test_conv_algorithms.py::test_every_forward_pass_alone_equals_direct[numpy-float64-winograd],"
            "tests/hidden/test_chapter2_hidden.py::test_winograd_forward_equals_the_loop_in_float64"
            "[n1c1f1_3x3_p0]", """\
{indent}import time
{indent}raise RuntimeError(f"called at {{time.time():.6f}}")
""", 0, ["called at"]),
    # the same across rank counts: a hidden test at p = 3, a visible one at p = 4 (the sandboxed jobs of one
    # grading share channels no namespace separates, such as the page cache of the read-only /usr)
    "8.3": ("tests/hidden/test_chapter8_hidden.py::test_sparse_allreduce_on_p_ranks_for_hand_made_supports"
            "[nprocs=3-one entry each],tests/test_sparse_allreduce.py::test_sparse_allreduce_is_the_dense_sum_and_"
            "sends_what_the_break_even_rule_says[nprocs=4]", """\
{indent}import time
{indent}raise RuntimeError(f"called at {{time.time():.6f}}")
""", 0, ["called at"]),
    # one rank of five waits for a message no rank sends
    "3.1": ("tests/hidden/test_chapter3_hidden.py::test_naive_heart_reads_source_and_writes_data[nprocs=5-sum]", """\
{indent}if rank == size - 1:
{indent}    comm.Recv(data, source=0, tag=999)
""", 0, ["timed out after 7 s at p = 5"]),
    # the collective the task must build, asked for by a name the source never spells
    "3.2": ("tests/hidden/test_chapter3_hidden.py::test_reduce_in_place_on_a_root_that_is_not_rank_0[nprocs=3]", """\
{indent}getattr(comm, "Reduce")(source, data, root=root)
""", 0, ["reaches Reduce"]),
    # not a ring: every whole vector goes all the way round on a copy of the communicator (which the
    # test must watch too), and decoys of the right sizes go on the one the test was given
    "3.4": ("tests/hidden/test_chapter3_hidden.py::test_ring_reduce_scatter_sends_p_minus_1_blocks_of_the_uneven_sizes"
            "[nprocs=3]", """\
{indent}hidden = comm.Dup()
{indent}everyone, passing = [source.copy()], source.copy()
{indent}for step in range(size - 1):
{indent}    arrived = np.empty_like(passing)
{indent}    hidden.Sendrecv(passing, (rank + 1) % size, REDUCE_SCATTER, arrived, (rank - 1) % size, REDUCE_SCATTER)
{indent}    everyone.append(arrived)
{indent}    passing = arrived
{indent}total = everyone[0].copy()
{indent}for other in everyone[1:]:
{indent}    combine(total, other, op)
{indent}block(rank)[...] = total[offsets[rank]:offsets[rank] + counts[rank]]
{indent}for step in range(size - 1):
{indent}    decoy = np.zeros(counts[(rank - step - 1) % size], data.dtype)
{indent}    sink = np.empty(counts[(rank - step - 2) % size], data.dtype)
{indent}    comm.Sendrecv(decoy, (rank + 1) % size, REDUCE_SCATTER, sink, (rank - 1) % size, REDUCE_SCATTER)
""", 0, ["a ring's, one way or the other"]),        # the copy's messages are traced too
    # "am I traced?": what a communicator lets one do must not differ between a test that watches it and
    # one that does not, or a body could run decoys where it is watched and anything else where it is not
    "3.7": ("tests/hidden/test_chapter3_hidden.py::test_allreduce_every_dtype_and_op[nprocs=3-butterfly],"
            "tests/hidden/test_chapter3_hidden.py::test_messages_bytes_and_reductions_equal_the_cost_formulas_"
            "with_other_item_sizes[nprocs=3-butterfly]", """\
{indent}said = [type(comm).__name__]
{indent}for make in (lambda: comm.Split(0, comm.Get_rank()), comm.Dup, lambda: comm.Split(comm.Get_rank() % 2, 0)):
{indent}    try:
{indent}        other = make()
{indent}        said.append(f"{{type(other).__name__}} of {{other.Get_size()}}")
{indent}    except Exception as error:
{indent}        said.append(f"refused: {{type(error).__name__}}: {{error}}")
{indent}raise RuntimeError(f"probe <{{said}}>")
""", 0, ["probe <"]),
    # a send never waited for: the grader must not free (or reuse) the memory MPI still reads, and the call
    # that left it fails
    "4.5": ("tests/hidden/test_chapter4_hidden.py::test_a_gossip_round_on_p_ranks_averages_each_pair_and_leaves_the_"
            "odd_one_out[nprocs=3-ring-0]", """\
{indent}import numpy
{indent}comm.Isend(numpy.full(60000, 65, numpy.uint8), (comm.Get_rank() + 1) % comm.Get_size(), 4242)
{indent}comm.Irecv(numpy.empty(60000, numpy.uint8), (comm.Get_rank() - 1) % comm.Get_size(), 4343)
""", 0, ["never waited for"]),                        # (the reference follows: the answer itself is right)
    # raw bytes the grader's own rank would unpickle (code of the student's, run as the grader): sent to
    # itself, received by a pickling receive
    "3.6": ("tests/hidden/test_chapter3_hidden.py::test_fold_in_every_dtype_and_op_reduces_each_pair_and_renumbers"
            "[nprocs=3]", """\
{indent}from collectives import student_helper
{indent}student_helper.own_the_grader(comm, {marker!r})
""", 0, ["not arrays"]),
    # the collective again, reached through a helper module of the student's that the fence only calls
    "3.5": ("tests/hidden/test_chapter3_hidden.py::test_allgather_every_dtype_length_and_in_place[nprocs=3]", """\
{indent}from collectives import student_helper
{indent}student_helper.complete(comm, data, counts, offsets)
""", 0, ["called allgather, which task 3.5 must build"]),           # ints too: no exemption
    # a daemon that would outlive the grading and write later; the answer itself is right
    "4.6": ("tests/hidden/test_chapter4_hidden.py::test_ensemble_prediction_on_p_members_is_their_mean_with_the_"
            "shape_of_one[nprocs=3-7]", """\
{indent}import os, time
{indent}if os.fork() == 0:
{indent}    os.setsid()
{indent}    if os.fork() == 0:
{indent}        time.sleep(60)
{indent}        open({marker!r}, "w")
{indent}    os._exit(0)
""", "full", []),
    # look for the hidden tests, the answers, the grader's checkout, its processes and the network;
    # answer wrong if anything is found
    "5.2": ("tests/hidden/test_chapter5_hidden.py::test_may_proceed_reads_the_clocks_of_a_dict_view_of_the_live_"
            "workers",
            """\
{indent}import glob, os, socket
{indent}found = [p for p in ("tests/hidden", "tutorials/assignments/answers.md", "/etc/shadow")
{indent}         if any(os.path.exists(os.path.join(base, p)) and os.access(os.path.join(base, p), os.R_OK)
{indent}                for base in ("/student", "/", ".", {root!r}))]
{indent}found += glob.glob("/*/tests/hidden") + glob.glob("/tmp/*/grader") + [
{indent}    p for p in glob.glob("/proc/*/environ")
{indent}    if os.access(p, os.R_OK) and b"MINIDL_GRADE" in open(p, "rb").read()]
{indent}try:
{indent}    socket.create_connection(("1.1.1.1", 53), timeout=2)
{indent}    found.append("the network")
{indent}except OSError:
{indent}    pass
{indent}if found:
{indent}    return not (staleness is None or clock - min(clocks) <= staleness)
""", "full", []),
    # eat the grader's memory
    "9.1": ("tests/hidden/test_chapter9_hidden.py::test_lr_at_the_schedules_edges_in_closed_form"
            "[a quarter into warm-up]", """\
{indent}import numpy
{indent}hog = numpy.ones(20 * 10**9 // 8)
""", 0, ["MemoryError"]),
    # never return
    "9.2": ("tests/hidden/test_chapter9_hidden.py::test_with_q_two_the_winners_are_the_two_best_and_nan_never_"
            "wins", """\
{indent}import time
{indent}time.sleep(10**6)
""", 0, ["timed out after 7 s at p = 1"]),
}
ANSWERED = {"4.5"}                            # bodies scored 0 although the reference's answer follows them
HELPER = '''"""A module the student added: the fence calls it, so the fence's own source names no collective."""
import pickle

import numpy as np


def complete(comm, data, counts, offsets):
    """The allgather's result from MPI's own allgather, each block smuggled in Python ints (scalars)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine, got = data[offsets[rank]:offsets[rank] + counts[rank]].tobytes(), [b""] * size
    for start in range(0, max(max(counts) * data.itemsize, 1), 1500):
        packed = int.from_bytes(mine[start:start + 1500] + b"\\x01", "little")
        for r, value in enumerate(comm.allgather(packed)):
            got[r] += value.to_bytes((value.bit_length() + 7) // 8, "little")[:-1]
    for r in range(size):
        data[offsets[r]:offsets[r] + counts[r]] = np.frombuffer(got[r], dtype=data.dtype)


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):                        # what unpickling it would run: a file written by the grader
        return (open, (self.marker, "w"))


def own_the_grader(comm, marker):
    rank = comm.Get_rank()
    blob = np.frombuffer(pickle.dumps(Payload(marker)), dtype=np.uint8).copy()
    request = comm.Isend(blob, dest=rank, tag=31337)
    comm.recv(source=rank, tag=31337)
    request.Wait()
'''


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The hostile submission graded once: (rows by task, results.json, stdout, seconds, markers)."""
    folder = tmp_path_factory.mktemp("redteam")
    tree = folder / "tree"
    ids = sorted(ATTACKS, key=lambda i: tuple(map(int, i.split("."))))
    assignments.make(tree, ids=ids)
    markers = {}
    for task in assignments.select(TASKS, ids):
        node, body, _, _ = ATTACKS[task.id]
        markers[task.id] = folder / f"written-by-{task.id}"
        lines, begin, _ = assignments.fence_of(task, tree)
        indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
        reference = assignments.body(task) if ATTACKS[task.id][2] == "full" or task.id in ANSWERED else []
        text = body.format(indent=indent, marker=str(markers[task.id]), root=str(ROOT))
        assignments.replace_body(task, tree, [*text.splitlines(keepends=True), *reference])
    (tree / "collectives" / "student_helper.py").write_text(HELPER)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "tests/grade.py"), "--student", str(tree), "--tasks",
                           ",".join(ids), "--tests", ",".join(attack[0] for attack in ATTACKS.values()),
                           "--timeout", str(TIMEOUT), "--json", str(folder / "g.json"),
                           "--gradescope", str(folder / "results.json")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["id"]: row for row in json.loads((folder / "g.json").read_text())["tasks"]}
    return rows, json.loads((folder / "results.json").read_text()), done.stdout, seconds, markers


@pytest.mark.parametrize("task_id", sorted(ATTACKS, key=lambda i: tuple(map(int, i.split(".")))))
def test_each_hostile_body_scores_nothing_and_says_why(graded, task_id):
    rows, _, _, _, _ = graded
    row, (node, _, expected, words) = rows[task_id], ATTACKS[task_id]
    assert row["total"] == len(node.split(",")) or row["failed"], row   # its tests were graded (or refused whole)
    if expected == "full":
        assert row["points"] == row["max_points"] and row["passed"] == 1, row
        return
    assert row["points"] == 0, row
    said = " ".join([*row["failed"], *(test["message"] for test in row["tests"])])
    assert all(word in said for word in words), (words, said)
    assert not any("forged" in test["name"] for test in row["tests"]), row


def test_the_hidden_tests_run_after_the_visible_ones_so_their_inputs_reach_no_visible_feedback(graded):
    rows, results, _, _, _ = graded
    numbers = {test["name"]: float(test["message"].split("called at ")[1].split()[0])
               for task in ("2.2", "8.3") for test in rows[task]["tests"]}
    hidden = [n for name, n in numbers.items() if name.startswith("tests/hidden/")]
    visible = [n for name, n in numbers.items() if not name.startswith("tests/hidden/")]
    assert hidden and visible and max(visible) < min(hidden), numbers


def test_a_body_cannot_tell_a_watched_communicator_from_another(graded):
    rows, _, _, _, _ = graded
    said = {test["name"]: test["message"].split("probe <")[1].split(">")[0] for test in rows["3.7"]["tests"]}
    assert len(said) == 2 and len(set(said.values())) == 1, said
    assert "refused" not in next(iter(said.values())), said


def test_nothing_the_bodies_start_writes_outside_the_sandbox_or_outlives_grading(graded):
    _, _, _, _, markers = graded
    assert not [task for task, marker in markers.items() if marker.exists()], "a payload ran outside the sandbox"
    from tests.test_sandbox import processes_of
    for uids in (sandbox.SANDBOX_UIDS, [sandbox.SANDBOX_UID, grade.GRADER_UID]):   # (no other grading meanwhile)
        for _ in range(50):                                 # killed processes take a moment to be gone
            alive = processes_of(uids)
            if not alive:
                break
            time.sleep(0.1)
        assert not alive, f"processes of a sandbox's or the grader's uid outlived the grading: {alive}"


def test_a_hang_costs_its_task_one_call_timeout_and_the_others_nothing(graded):
    rows, _, _, seconds, _ = graded
    for task_id in ("3.1", "9.2"):                          # the watchdog's words: one call's timeout, then it stopped
        assert [test["message"] for test in rows[task_id]["tests"]] and all(
            f"timed out after {TIMEOUT - 5} s" in test["message"] or test["status"] == "not run"
            for test in rows[task_id]["tests"]), rows[task_id]
    graded_after = [row for task_id, row in rows.items() if task_id not in ("3.1", "9.2") and row["tests"]]
    assert all(test["status"] != "not run" for row in graded_after for test in row["tests"]), graded_after
    assert rows["4.6"]["points"] == rows["4.6"]["max_points"] and rows["5.2"]["points"] == rows["5.2"]["max_points"]


def test_gradescopes_scores_add_up_to_each_tasks_points_exactly(graded):
    rows, results, _, _, _ = graded
    fields = {"name", "score", "max_score", "status", "output", "visibility"}
    assert all(set(test) >= fields for test in results["tests"])
    assert all(test["visibility"] == ("after_published" if "tests/hidden/" in test["name"] else "visible")
               for test in results["tests"])
    for task_id, row in rows.items():
        tests = [test for test in results["tests"] if test["name"].startswith(f"{task_id} ")]
        assert round(sum(test["max_score"] for test in tests), 6) == row["max_points"], (task_id, tests)
        assert round(sum(test["score"] for test in tests), 6) == row["points"] <= row["max_points"], (task_id, tests)
    assert results["score"] == round(sum(row["points"] for row in rows.values()), 6)
