"""The trusted driver that tutorials/assignments/sandbox.py runs inside the sandbox, once per rank.

    python sandbox_driver.py TREE IO MODULE FUNCTION NPROCS [serve]

It loads this rank's arguments from ``IO/in/args.<rank>.npz`` (0-d arrays become Python scalars
and strings; the names listed in ``__none__`` become None; or, with ``__values__``, any value
tutorials/assignments/values.py packs, and then the reply is packed the same way: the return
value and every argument after the call), imports MODULE from TREE, calls ``FUNCTION(**args)`` (with ``comm=MPI.COMM_WORLD``
if the function takes a ``comm``), and writes ``IO/out/reply.<rank>.npz``: the return value
(``return``; a tuple as ``return.0``, ``return.1``, ...; a dict as ``return.<key>``) and every
array argument the call changed in place, under its own name. An exception is written as
``__error__`` (its type and message); on several ranks the job is then aborted.

With FUNCTION ``*`` each call names its function: the arguments are one packed value
{"function", "args", "kwargs"} (values.py's ``pack_call``: the task's function, a closure of it,
or a method, rebuilt from TREE; the call's ``comm`` is this job's), and the reply is
``pack_reply`` of {"return", "after": that value}, the things that arrived tagged as such.

``serve`` keeps the job for many calls (``sandbox.Session``): call number K reads
``IO/in/args.K.<rank>.npz`` once it appears and writes ``IO/out/reply.K.<rank>.npz``.

"Trusted" means only that the grader wrote it: it runs in the same process as the student's code,
which can rewrite any of this. That is why sandbox.py trusts nothing it reads back except arrays.
"""
import functools
import importlib
import inspect
import itertools
import os
import sys
import time
import traceback
import zipfile

import numpy as np


SUBCOMMS = []


def load(path):
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    if "__values__" in arrays:                  # packed by tutorials/assignments/values.py: kept as it is
        return arrays
    nones = [str(name) for name in arrays.pop("__none__", [])]
    values = {name: array.item() if array.ndim == 0 else array for name, array in arrays.items()}
    return {**values, **{name: None for name in nones}}


def save(path, arrays):
    """An uncompressed .npz (np.savez's format, written by hand: a key may be named 'file')."""
    part = path + ".part"
    with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asarray(value), allow_pickle=False)
    os.replace(part, path)


def failure(error):
    """The reply of a call that raised: what (``__error__``) and where (``__traceback__``, its last
    frames: this call's own, not the tail of a log that every earlier call wrote into too)."""
    return {"__error__": f"{type(error).__name__}: {error}"[:2000],
            "__traceback__": "".join(traceback.format_exception(error))[-1500:]}


def flatten(value):
    """{name: value} of a return value: None is nothing, a tuple or dict is taken apart."""
    if value is None:
        return {}
    if isinstance(value, tuple):
        return {f"return.{i}": item for i, item in enumerate(value)}
    if isinstance(value, dict):
        return {f"return.{key}": item for key, item in value.items()}
    return {"return": value}


def only_arrays(arrays):
    for name, value in arrays.items():
        if not isinstance(value, (np.ndarray, np.generic, bool, int, float, complex, str, list)) \
                or np.asarray(value).dtype.hasobject:
            raise TypeError(f"only arrays, numbers and strings cross back; {name} is a {type(value).__name__}")
    return arrays


def recorder(comm):
    """``comm`` wrapped so that every point-to-point call is kept as a row (sent peer, bytes, tag,
    received peer, bytes, tag; -1 where there is none): the grader replays them into its own
    watched communicator (collectives.trace.WatchedComm), whose tests count the messages."""
    from collectives.trace import WatchedComm

    class Recorder(WatchedComm):
        def __init__(self, comm):
            super().__init__(comm)
            self.rows = []

        def watch(self, start, end, sent=None, received=None):
            self.rows.append([*(sent or (-1, -1, -1)), *(received or (-1, -1, -1))])
    return Recorder(comm)


def call_once(target, comm, arguments, reply):
    kwargs = load(arguments)
    watched = None
    if bool(kwargs.pop("__watch__", False)) and comm is not None:
        comm = watched = recorder(comm)
    if "__values__" in kwargs and target is None:    # a call that names its function (and its comm)
        values = codec()
        mine = (comm, *((comm.comm,) if watched is not None else ()))
        world = mine[-1]
        if not SUBCOMMS:                            # the job's communicators of some of its ranks
            SUBCOMMS.append(values.subcommunicators(world))
        message, seen = values.unpack_call(kwargs, comm=comm, subcomm=SUBCOMMS[0])
        if not (isinstance(message, dict) and message.keys() == {"function", "args", "kwargs"}
                and callable(message["function"]) and isinstance(message["args"], tuple)):
            raise TypeError("not a call: a dict of 'function', 'args' and 'kwargs'")
        result = message["function"](*message["args"], **message["kwargs"])
        arrays = values.pack_reply({"return": result, "after": message}, seen, comm=mine,
                                   subcomm=values.world_ranks(world))
    elif "__values__" in kwargs:                # any value the codec carries: the reply is packed too
        values = codec()
        kwargs = values.unpack(kwargs)
        result = target(**kwargs, **({} if comm is None else {"comm": comm}))
        arrays = values.pack({"return": result, "after": kwargs})
    else:
        before = {name: value.copy() for name, value in kwargs.items() if isinstance(value, np.ndarray)}
        if comm is not None:
            kwargs["comm"] = comm
        arrays = flatten(target(**kwargs))
        arrays.update({name: kwargs[name] for name, old in before.items()
                       if kwargs[name].tobytes() != old.tobytes()})
    if watched is not None:
        arrays["__messages__"] = np.array(watched.rows, dtype=np.int64).reshape(-1, 6)
    save(reply, only_arrays(arrays))


@functools.lru_cache(maxsize=None)
def codec():
    """tutorials/assignments/values.py (and codec.py), copied beside this file (sandbox.py puts them there)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sandbox_values", os.path.join(os.path.dirname(__file__), "values.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_for(path):
    """Until ``path`` exists (the grader writes each call's arguments and renames them into place)."""
    pause = 0.0005
    while not os.path.exists(path):
        time.sleep(pause)
        pause = min(2 * pause, 0.002)


def main(tree, io, module, function, nprocs, serve=""):
    world, comm, rank = None, None, 0
    if int(nprocs) > 1:
        from mpi4py import MPI
        world = MPI.COMM_WORLD
        rank = world.Get_rank()
    reply = f"{io}/out/reply.{rank}.npz"
    try:
        sys.path.insert(0, tree)
        target = None if function == "*" else getattr(importlib.import_module(module), function)
        if target is None or "comm" in inspect.signature(target).parameters:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        if not serve:
            call_once(target, comm, f"{io}/in/args.{rank}.npz", reply)
            return
        for number in itertools.count():
            reply = f"{io}/out/reply.{number}.{rank}.npz"
            wait_for(f"{io}/in/args.{number}.{rank}.npz")
            try:
                call_once(target, comm, f"{io}/in/args.{number}.{rank}.npz", reply)
            except Exception as error:
                if world is not None:                   # the other ranks may wait for this one: end the job
                    raise
                traceback.print_exc()                   # one rank: say why, and serve the next call
                save(reply, failure(error))
    except BaseException as error:                      # SystemExit too: say why, then end the job
        traceback.print_exc()
        save(reply, failure(error))
        if world is not None:
            world.Abort(1)
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:7])
