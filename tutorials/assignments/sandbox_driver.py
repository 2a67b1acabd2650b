"""The trusted driver that tutorials/assignments/sandbox.py runs inside the sandbox, once per rank.

    python sandbox_driver.py TREE IO MODULE FUNCTION NPROCS

It loads this rank's arguments from ``IO/in/args.<rank>.npz`` (0-d arrays become Python scalars
and strings), imports MODULE from TREE, calls ``FUNCTION(**args)`` (with ``comm=MPI.COMM_WORLD``
if the function takes a ``comm``), and writes ``IO/out/reply.<rank>.npz``: the return value
(``return``; a tuple as ``return.0``, ``return.1``, ...; a dict as ``return.<key>``) and every
array argument the call changed in place, under its own name. An exception is written as
``__error__`` (its type and message); on several ranks the job is then aborted.

"Trusted" means only that the grader wrote it: it runs in the same process as the student's code,
which can rewrite any of this. That is why sandbox.py trusts nothing it reads back except arrays.
"""
import importlib
import inspect
import os
import sys
import traceback
import zipfile

import numpy as np


def load(path):
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    return {name: array.item() if array.ndim == 0 else array for name, array in arrays.items()}


def save(path, arrays):
    """An uncompressed .npz (np.savez's format, written by hand: a key may be named 'file')."""
    part = path + ".part"
    with zipfile.ZipFile(part, "w", zipfile.ZIP_STORED) as archive:
        for name, value in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.asarray(value), allow_pickle=False)
    os.replace(part, path)


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


def main(tree, io, module, function, nprocs):
    comm, rank = None, 0
    if int(nprocs) > 1:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
    kwargs = load(f"{io}/in/args.{rank}.npz")
    before = {name: value.copy() for name, value in kwargs.items() if isinstance(value, np.ndarray)}
    reply = f"{io}/out/reply.{rank}.npz"
    try:
        sys.path.insert(0, tree)
        target = getattr(importlib.import_module(module), function)
        if "comm" in inspect.signature(target).parameters:
            if comm is None:
                from mpi4py import MPI
                comm = MPI.COMM_WORLD
            kwargs["comm"] = comm
        arrays = flatten(target(**kwargs))
        arrays.update({name: kwargs[name] for name, old in before.items()
                       if kwargs[name].tobytes() != old.tobytes()})
        save(reply, only_arrays(arrays))
    except BaseException as error:                      # SystemExit too: say why, then end the job
        traceback.print_exc()
        save(reply, {"__error__": f"{type(error).__name__}: {error}"[:2000]})
        if comm is not None and comm.Get_size() > 1:
            comm.Abort(1)
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:6])
