"""What every public collective does around its algorithm: arguments, in-place use, staging.

    allreduce(comm, sendbuf, recvbuf, op)           # the public function of each module
      1. look at this rank's own arguments          (1-D, contiguous, a supported dtype, same dtype
                                                     and length, recvbuf writable)
      2. agree with the other ranks (check=True)    (collectives.check: one small message per step)
      3. copy sendbuf into recvbuf                  (unless sendbuf is MPI.IN_PLACE or recvbuf itself,
                                                     or the heart reads sendbuf itself: see below)
      4. stage a CuPy buffer to host memory         (unless MPI is CUDA-aware)
      5. run the algorithm in place on one vector   (the module's heart, e.g. ring.ring_allreduce_in_place)
      6. finish the op (mean: divide by p) and copy a staged buffer back to the device

Every heart therefore sees one contiguous 1-D vector `data` that holds this rank's input on
entry and the result on exit, and only point-to-point calls move it.

Blocks. Algorithms that split the vector (ring, Rabenseifner, reduce-scatter, allgather) cut
n elements into `parts` blocks whose sizes differ by at most one, the first n % parts blocks
one element longer: n = 10, parts = 4 gives counts [3, 3, 2, 2] at offsets [0, 3, 6, 8].
Blocks may be empty (n < parts); they are still sent, as zero-byte messages, so the number of
messages never depends on n (except n == 0, where nothing is sent at all).

Hot path. A small allreduce is mostly Python: at 4 KiB on p = 2 the full argument check
(describe_problem on both buffers, numpy's dtype introspection) cost ~50 us a call, over 10x
the MPI exchange itself (`mpiexec -n 2 python -m collectives.bench --sizes 4K`). So with
check=False `run_allreduce` first tries `fast_arguments`: a few attribute tests that accept
only the plain case (two 1-D, contiguous, non-overlapping numpy arrays of one supported dtype
and length, recvbuf writable; the dtype's verdict cached) and fall back to the full check
(with its error messages) for anything else. And the hearts take their receive buffers from
`scratch(n, dtype)`, one cached vector per (n, dtype) instead of a fresh allocation each call.

No copy-in. Every allreduce heart reads its input in its first steps and writes every element
of the result, so an out-of-place call hands it sendbuf as `source` and skips step 3's copy
(in run_allreduce): the first sends go out from sendbuf, and the first reduction,
`combine(into, incoming, op, source)`, reads its left operand there, with the same operand
order and so the same bits. (Rabenseifner and the butterfly still copy first when p is not a
power of two: their fold-in reads `data`.) MPICH's Allreduce copies sendbuf into recvbuf
first, a whole pass over memory that this saves.

CuPy. A CuPy array is given to MPI only after the device is synchronised (the kernels that
wrote it have finished). If MPI is not CUDA-aware (the default assumption: set
MINIDL_CUDA_AWARE_MPI=1 when it is), the vector is copied to host memory, reduced there with
numpy, and copied back; if it is, device pointers go to MPI directly and `ops.combine`
reduces on the device and synchronises before the next send.
"""
import contextvars
import functools
import itertools
import os
import threading

import numpy as np
from mpi4py import MPI

from .check import Problem, agree, dtype_code, dtype_problem
from .ops import OPS, array_module, finish


@functools.lru_cache(maxsize=256)
def blocks(n, parts):
    """(counts, offsets) of `parts` nearly equal blocks of n elements, the first n % parts one longer,
    as tuples; offsets has parts + 1 entries (offsets[i] = counts[0] + ... + counts[i - 1], the last n).
    Cached: every call of a training loop, and every rank of a simulated run, cuts the same vector
    (at p = 16,384 simulated ranks, cutting it afresh on each was p^2 = 268 million additions)."""
    base, extra = divmod(n, parts)
    counts = (base + 1,) * extra + (base,) * (parts - extra)
    return counts, tuple(itertools.accumulate(counts, initial=0))


def block_counts(n, parts):
    """Sizes of `parts` nearly equal blocks of n elements, the first n % parts one longer."""
    return list(blocks(n, parts)[0])


def block_offsets(counts):
    """Start of each block: offsets[i] = counts[0] + ... + counts[i-1]."""
    offsets = [0]
    for count in counts[:-1]:
        offsets.append(offsets[-1] + count)
    return offsets


_SCRATCH = threading.local()   # per thread: (n, dtype) -> a cached numpy receive buffer, see scratch()
# a cache of one's own where one thread runs several hearts in turn (collectives.sim: one coroutine
# per simulated rank sets it to a fresh dict); None: the thread's
SCRATCH_CACHE = contextvars.ContextVar("collectives_scratch", default=None)
_SUPPORTED = {}        # dtype -> whether dtype_problem accepts it (cached for fast_arguments)


def release_scratch():
    """Forget this thread's cached receive buffers (``scratch``): the next call allocates afresh.
    For measuring what a collective allocates (``algorithms.memory``); never needed for correctness."""
    _SCRATCH.__dict__.clear()


def scratch(like, n=None):
    """A receive buffer of n (default len(like)) elements of like's dtype, reused between calls.

    Numpy vectors come from a cache keyed by (n, dtype); its content is garbage on entry. Only
    one heart runs at a time in a thread and none calls another while it holds its scratch, so
    one buffer per key and thread is enough (collectives.nonblocking runs several hearts at once,
    each in its own thread; collectives.sim runs every simulated rank's heart as a coroutine in one
    thread, so each coroutine gets its own cache through SCRATCH_CACHE). CuPy vectors get a fresh
    allocation (CuPy's pool caches).
    """
    n = len(like) if n is None else n
    if type(like) is not np.ndarray:
        return array_module(like).empty(n, dtype=like.dtype)
    key = (n, like.dtype)
    cache = SCRATCH_CACHE.get()
    if cache is None:
        cache = _SCRATCH.__dict__
    buffer = cache.get(key)
    if buffer is None:
        buffer = cache[key] = np.empty(n, dtype=like.dtype)
    return buffer


def _supported(dtype):
    verdict = _SUPPORTED.get(dtype)
    if verdict is None:
        verdict = _SUPPORTED[dtype] = dtype_problem(dtype) is None
    return verdict


def fast_arguments(sendbuf, recvbuf, op):
    """True if (sendbuf, recvbuf, op) is the plain numpy case that validate() would accept.

    A few attribute tests, no messages; False means "not sure": run the full check.
    """
    if type(recvbuf) is not np.ndarray or op not in OPS:
        return False
    flags = recvbuf.flags
    if recvbuf.ndim != 1 or not flags.c_contiguous or not flags.writeable or not _supported(recvbuf.dtype):
        return False
    if sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return True
    return (type(sendbuf) is np.ndarray and sendbuf.ndim == 1 and sendbuf.flags.c_contiguous
            and sendbuf.dtype == recvbuf.dtype and sendbuf.size == recvbuf.size
            # two arrays that each own their memory cannot overlap; views get the bounds check
            and ((sendbuf.base is None and recvbuf.base is None) or not np.may_share_memory(sendbuf, recvbuf)))


def cuda_aware_mpi():
    """Whether device pointers may go to MPI directly (MINIDL_CUDA_AWARE_MPI=1), default no."""
    return os.environ.get("MINIDL_CUDA_AWARE_MPI", "0") == "1"


def to_mpi(array):
    """The array MPI should see: a host copy of a CuPy array, unless MPI is CUDA-aware."""
    xp = array_module(array)
    if xp is np or not hasattr(xp, "cuda"):       # numpy, or a stand-in without memory (collectives.sim.Sized)
        return array
    xp.cuda.get_current_stream().synchronize()   # kernels writing `array` must be done
    return array if cuda_aware_mpi() else xp.asnumpy(array)


def copy_into(target, source):
    """target[...] = source, where source may be a host copy of a device target."""
    if array_module(target) is array_module(source):
        target[...] = source
    else:
        target.set(source)                       # host -> device
        array_module(target).cuda.get_current_stream().synchronize()


def from_mpi(staged, array):
    """Copy a staged host vector back into the device array it came from (no-op otherwise)."""
    if staged is not array:
        copy_into(array, staged)


def describe_problem(buffer, role, length=None, dtype=None, written=False):
    """Why `buffer` cannot be used (a check.Problem), or None.

    written: the call writes into this buffer (recvbuf; in place, that is the input too), so a
    read-only array is refused here, before any message, instead of failing at the first write.
    """
    if not hasattr(buffer, "dtype") or not hasattr(buffer, "ndim"):
        return Problem("a buffer that is not an array",
                       f"{role} must be a numpy or cupy array, not {type(buffer).__name__}")
    if buffer.ndim != 1:
        return Problem("a buffer that is not 1-D",
                       f"{role} must be 1-D (flatten it first), got shape {buffer.shape}")
    if not buffer.flags.c_contiguous:
        return Problem("a non-contiguous buffer",
                       f"{role} must be contiguous (a strided view cannot be sent as one buffer)")
    unsupported = dtype_problem(buffer.dtype)
    if unsupported:
        return Problem("an unsupported dtype", f"{role} has {unsupported}")
    if dtype is not None and buffer.dtype != dtype:
        return Problem("buffers of different dtypes",
                       f"{role} has dtype {buffer.dtype} but the other buffer has {dtype}")
    if length is not None and buffer.size != length:
        return Problem("a buffer of the wrong length",
                       f"{role} has {buffer.size} elements but should have {length}")
    if written and not getattr(buffer.flags, "writeable", True):     # CuPy arrays have no such flag
        return Problem("a read-only buffer to write the result into",
                       f"{role} is read-only (writeable=False) but the result is written into it")
    return None


def validate(comm, name, buffers, op, check, root=0, problem=None):
    """Steps 1 and 2: this rank's own arguments, then (check=True) agreement with every rank.

    buffers: list of (array, role, expected length or None, written). The first one is the full
    vector: its length and dtype must agree across ranks, and the others must have its dtype;
    `written` says whether the call writes into it (then it must be writable).
    With check=True a problem on any rank raises MismatchError on every rank; with
    check=False it raises ValueError on the rank that has it only, before that rank sends
    anything (the others may then hang: check=False trusts the caller).
    """
    first = buffers[0][0]
    dtype = getattr(first, "dtype", None)
    for buffer, role, length, written in buffers:
        problem = problem or describe_problem(buffer, role, length, dtype, written)
    if problem is None and op not in OPS:
        problem = Problem("an unknown op", f"unknown op {op!r}; choose one of {OPS}")
    if check:
        ok = problem is None
        agree(comm, name, {"length": first.size if ok else -1,
                           "dtype": dtype_code(dtype) if ok else -1,
                           "op": OPS.index(op) if ok else -1,
                           "root": root}, problem)
    elif problem:
        raise ValueError(f"{name} on rank {comm.Get_rank()}: {problem.text}")


def allreduce_arguments(comm, name, sendbuf, recvbuf, op, check, root=0):
    """validate() for the (sendbuf, recvbuf) pair of an allreduce or reduce; True if in place.

    recvbuf is written (in place it holds the input too); sendbuf is only read.
    """
    in_place = sendbuf is MPI.IN_PLACE or sendbuf is recvbuf
    buffers = [(recvbuf, "recvbuf", None, True)]
    problem = None
    if not in_place:
        buffers.append((sendbuf, "sendbuf", getattr(recvbuf, "size", None), False))
        if (describe_problem(sendbuf, "sendbuf") is None and describe_problem(recvbuf, "recvbuf") is None
                and array_module(sendbuf).shares_memory(sendbuf, recvbuf)):
            problem = Problem("overlapping buffers",
                              "sendbuf overlaps recvbuf without being the same array (use MPI.IN_PLACE)")
    validate(comm, name, buffers, op, check, root, problem)
    return in_place


def run_allreduce(heart, comm, sendbuf, recvbuf, op="sum", check=True, name="allreduce"):
    """Steps 1-6 around `heart(comm, data, base_op)`; returns recvbuf.

    These are the arguments of every module's allreduce: sendbuf may be MPI.IN_PLACE (or
    recvbuf itself); op is "sum", "max", "min" or "mean"; check=False skips the agreement across
    ranks (collectives.check) and trusts the caller; recvbuf=None allocates the result (sendbuf
    must then be an array). For two numpy buffers out of place the heart also takes
    `source=sendbuf` and reads the input there, so step 3's copy is left out ("No copy-in" above).
    """
    if recvbuf is None and hasattr(sendbuf, "dtype"):
        recvbuf = array_module(sendbuf).empty_like(sendbuf)
    if not check and fast_arguments(sendbuf, recvbuf, op):      # the hot path: see the header
        in_place = sendbuf is MPI.IN_PLACE or sendbuf is recvbuf
    else:
        in_place = allreduce_arguments(comm, name, sendbuf, recvbuf, op, check)
    size = comm.Get_size()
    source = None
    if not in_place:
        if size > 1 and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            source = sendbuf
        else:
            recvbuf[...] = sendbuf
    data = recvbuf if type(recvbuf) is np.ndarray else to_mpi(recvbuf)
    if size > 1 and data.size > 0:
        base = "sum" if op == "mean" else op                  # base_op(op), inlined: op was checked above
        if source is None:
            heart(comm, data, base)
        else:
            heart(comm, data, base, source=source)
    if op == "mean":
        finish(data, op, size)
    if data is not recvbuf:
        from_mpi(data, recvbuf)
    return recvbuf
