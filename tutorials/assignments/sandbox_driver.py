"""The driver that tutorials/assignments/sandbox.py runs inside the sandbox.

    python driver.py TREE serve IN_FD OUT_FD          # one process: the grader's calls, one by one
    mpiexec -n P python driver.py TREE job IN_FD OUT_FD   # P ranks: each call runs on all of them

It speaks frames (channel.py, beside it) on two pipes the sandbox hands it, and imports the
student's code from TREE. Each call frame is a packed call (values.py: the function, its
arguments and keyword arguments, built here from TREE); the reply frame is replies.py's: the
return value as data and what the call changed of what it was sent. An exception is an error
frame (its type and message, and the call's own traceback).

**serve** (the graded function of one grader rank): the call's communicators are the grader's
(proxy.py): every MPI call of the student's code is an "op" frame the grader answers. A Tensor the
call returns keeps its backward here, under a handle; a "backward" frame runs it.

**job** (a whole run that every rank enters, servers included: ``mpiexec`` inside the sandbox):
rank 0 reads one frame holding every rank's call (``r<rank>.<entry>``), hands each rank its own,
and writes one frame of every rank's reply. A rank whose call raises writes its own error frame
(small enough for one atomic write) before the job ends, so the grader hears the root cause.

"Trusted" means only that the grader wrote this file: it runs in the same process as the
student's code, which can rewrite any of it. That is why the grader trusts nothing it reads back
but data (replies.py) and its own communicators' records.
"""
import importlib
import importlib.util
import inspect
import os
import sys
import traceback

import numpy as np


def _beside(name):
    """A module of the grader's, copied beside this file (never the student tree's copy)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), name + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


channel = _beside("channel")
ERROR_TEXT = 1500                                  # an error frame stays under one atomic pipe write (4096 bytes)


def failure(error, rank=0):
    """The frame of a call that raised: what (``__error__``) and where (``__traceback__``: its last frames)."""
    text = "".join(traceback.format_exception(error))
    return {"kind": np.array("error"), "rank": np.array(rank), "__error__": np.array(f"{type(error).__name__}: "
            f"{error}"[:ERROR_TEXT]), "__traceback__": np.array(text[-ERROR_TEXT:])}


class Link:
    """This process's end of the channel: the grader's calls in, replies and MPI ops out."""

    def __init__(self, in_fd, out_fd):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.replies = _beside("replies")

    def op(self, name, handle, arrays, fields):
        """One MPI call made by the grader on communicator (or request) ``handle``: (first, second)."""
        channel.write_frame(self.out_fd, self.replies.pack_op(name, handle, list(arrays), fields))
        answer = channel.read_frame(self.in_fd)
        if "__error__" in answer:
            raise RuntimeError(f"{name}: {answer['__error__']}")
        return self.replies.unpack_result(answer)


def call_of(values, frame, comms):
    """(message, seen) of a call frame: a packed call of the project's function, or with ``__target__``
    ("module", "function"), that function of TREE with packed keyword arguments (sandbox.call's)."""
    if "__target__" in frame:
        module, function = (str(part) for part in frame["__target__"])
        target = getattr(importlib.import_module(module), function)
        kwargs, seen = values.unpack_call(frame, comms=comms)
        if "comm" in inspect.signature(target).parameters and "comm" not in kwargs:
            kwargs["comm"] = comms(0, 0, 1) if comms is not None else None
        message = {"function": target, "args": (), "kwargs": kwargs}
    else:
        message, seen = values.unpack_call(frame, comms=comms)
    if not (isinstance(message, dict) and message.keys() == {"function", "args", "kwargs"}
            and callable(message["function"]) and isinstance(message["args"], tuple)
            and isinstance(message["kwargs"], dict)):
        raise TypeError("not a call: a dict of 'function', 'args' and 'kwargs'")
    return message, seen


class Server:
    """The ``serve`` loop: calls (and a returned Tensor's backward) one at a time, on one process."""

    def __init__(self, link):
        self.link, self.values, self.replies = link, _beside("values"), _beside("replies")
        proxy = _beside("proxy")
        proxy.install()
        self.proxy, self.kept = proxy, {}

    def comm(self, handle, rank, size):
        """A stand-in for the grader's communicator ``handle`` of this call (handles live for one call)."""
        return self.proxy.ProxyComm(self.link, handle, rank, size)

    def keeper(self, seen):
        """``keep`` for a reply: a returned Tensor's backward stays here under a new handle, with the
        call's things (its backward's changes to them are named as the call's were)."""
        def keep(closure):
            handle = len(self.kept)
            self.kept[handle] = (closure, seen)
            return handle
        return keep

    def one(self, frame):
        if "__warm__" in frame:                       # import the tasks' modules now, before any call is timed
            for module in str(frame["__warm__"]).split(","):
                importlib.import_module(module)
            return {"__ready__": np.array(True)}
        if "__backward__" in frame:                   # a Tensor's backward that stayed here
            closure, seen = self.kept[int(frame["__backward__"])]
            before = self.replies.snapshot(seen)
            result = closure(frame["grad"])
            return self.replies.pack_reply(result, seen, before, self.keeper(seen))
        message, seen = call_of(self.values, frame, comms=self.comm)
        before = self.replies.snapshot(seen)
        result = message["function"](*message["args"], **message["kwargs"])
        return self.replies.pack_reply(result, seen, before, self.keeper(seen))

    def serve(self):
        while True:
            try:
                frame = channel.read_frame(self.link.in_fd)
            except channel.Closed:
                return
            try:
                reply = {"kind": np.array("reply"), **self.one(frame)}
            except Exception as error:                # the student's code raised: say why, serve on
                reply = failure(error)
            channel.write_frame(self.link.out_fd, reply)


def job(in_fd, out_fd):
    """The ``job`` loop under mpiexec: every call runs on every rank of the sandbox's own world."""
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, values, replies = world.Get_rank(), _beside("values"), _beside("replies")
    while True:
        parts = None
        if rank == 0:
            try:
                frame = channel.read_frame(in_fd)
            except channel.Closed:
                frame = None
            parts = [None if frame is None else frame if "__warm__" in frame else
                     {key.split(".", 1)[1]: array for key, array in frame.items() if key.startswith(f"r{r}.")}
                     for r in range(world.Get_size())]
        mine = world.scatter(parts, root=0)           # inside the sandbox: the job's own messages
        if mine is None:
            return
        if "__warm__" in mine:                        # every rank imports the task's module before any call
            try:
                for module in str(mine["__warm__"]).split(","):
                    importlib.import_module(module)
            except BaseException as error:
                channel.write_frame(out_fd, failure(error, rank))
                world.Abort(1)
            world.Barrier()
            if rank == 0:
                channel.write_frame(out_fd, {"__ready__": np.array(True)})
            continue
        try:
            message, seen = call_of(values, mine, comms=lambda handle, r, s: world if handle == 0
                                    else values.Unreachable())
            before = replies.snapshot(seen)
            result = message["function"](*message["args"], **message["kwargs"])
            reply = replies.pack_reply(result, seen, before)
        except BaseException as error:                # this rank's own words, then the whole job ends
            channel.write_frame(out_fd, failure(error, rank))
            world.Abort(1)
        everything = world.gather(reply, root=0)
        if rank == 0:
            channel.write_frame(out_fd, {"kind": np.array("reply"), **{f"r{r}.{key}": array
                                         for r, arrays in enumerate(everything) for key, array in arrays.items()}})


def main(tree, mode, in_fd, out_fd):
    sys.path.insert(0, tree)
    in_fd, out_fd = int(in_fd), int(out_fd)
    try:
        if mode == "serve":
            Server(Link(in_fd, out_fd)).serve()
        else:
            job(in_fd, out_fd)
    except BaseException as error:                    # the driver itself failed (or exit): say why
        traceback.print_exc()
        try:
            channel.write_frame(out_fd, failure(error))
        except OSError:
            pass
        sys.exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
