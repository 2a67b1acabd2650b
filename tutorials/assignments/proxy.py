"""In the sandbox: a communicator whose every call the grader makes (the grader is the network).

A graded call's communicators arrive as ``ProxyComm``s. Each method the student's code calls is
one "op" frame to the grader (tutorials/assignments/channel.py), which makes that same call on
its own communicator (the one the test handed over: a ``TracedComm`` records the messages there,
where the student's code cannot reach them) and answers with a "result" frame: what arrived, the
status, or the MPI error. So a Recv blocks until the grader's Recv returns, exactly as MPI's would,
and a ring on five sandboxed ranks is five grader ranks' messages. Only data crosses: buffers as
arrays, ranks and tags as numbers, a pickling call's object as data (replies.py's vocabulary).

``MPI.Request`` in this process becomes ``ProxyRequest`` (its ``Waitall``, ``Waitany``, ...), so
code that waits on requests with the class's methods waits on the grader's. This file imports
nothing of the project: the sandbox loads it from beside its driver.
"""
import numpy as np
from mpi4py import MPI

OPS = {"SUM": MPI.SUM, "MAX": MPI.MAX, "MIN": MPI.MIN, "PROD": MPI.PROD, "LAND": MPI.LAND, "LOR": MPI.LOR,
       "BAND": MPI.BAND, "BOR": MPI.BOR}


def op_name(op):
    for name, known in OPS.items():
        if op == known:
            return name
    raise ValueError("only MPI's predefined reductions (SUM, MAX, MIN, PROD, LAND, LOR, BAND, BOR) cross the sandbox")


def _array(buffer):
    """The array of an mpi4py buffer argument: an array, or [array, datatype] / [array, count, datatype]."""
    if isinstance(buffer, (list, tuple)):
        buffer = buffer[0]
    if buffer is MPI.IN_PLACE or buffer is None:
        return None
    array = np.asarray(buffer)
    if array.dtype.hasobject:
        raise TypeError("an object array is not a buffer")
    if not array.flags.c_contiguous:
        raise BufferError("ndarray is not C-contiguous")
    return array


def _into(buffer, data, count):
    """Write the first ``count`` bytes that arrived into ``buffer`` (as MPI does: the rest stays)."""
    target = _array(buffer)
    if target is None or count is None:
        return
    flat = target.reshape(-1).view(np.uint8)
    flat[:count] = np.asarray(data).reshape(-1).view(np.uint8)[:count]


def _fill(status, info):
    if status is not None and info is not None:
        source, tag, count = info
        status.source, status.tag = source, tag
        status.Set_elements(MPI.BYTE, count)


class ProxyComm:
    """A communicator of the grader's, number ``handle`` of this call, seen from the sandbox."""

    def __init__(self, link, handle, rank, size):
        self._link, self._handle, self._rank, self._size = link, handle, rank, size
        self._attributes = {}

    def _op(self, name, *arrays, **fields):
        return self._link.op(name, self._handle, arrays, fields)

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    rank = property(Get_rank)
    size = property(Get_size)

    # point to point, on buffers
    def Send(self, buf, dest, tag=0):
        self._op("Send", _array(buf), dest=dest, tag=tag)

    Ssend = Send

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        data, info = self._op("Recv", _array(buf), source=source, tag=tag)
        _into(buf, data, info[2])
        _fill(status, info)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG,
                 status=None):
        data, info = self._op("Sendrecv", _array(sendbuf), _array(recvbuf), dest=dest, sendtag=sendtag,
                              source=source, recvtag=recvtag)
        _into(recvbuf, data, info[2])
        _fill(status, info)

    def Isend(self, buf, dest, tag=0):
        handle, _ = self._op("Isend", _array(buf), dest=dest, tag=tag)
        return ProxyRequest(self._link, handle, None)

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):
        handle, _ = self._op("Irecv", _array(buf), source=source, tag=tag)
        return ProxyRequest(self._link, handle, buf)

    def Probe(self, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        _, info = self._op("Probe", source=source, tag=tag)
        _fill(status, info)
        return True

    def Iprobe(self, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        flag, info = self._op("Iprobe", source=source, tag=tag)
        _fill(status, info)
        return bool(flag)

    # collectives, on buffers
    def Barrier(self):
        self._op("Barrier")

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        data, _ = self._op("Allreduce", _array(sendbuf), _array(recvbuf), op=op_name(op))
        _into(recvbuf, data, _array(recvbuf).nbytes)

    def Bcast(self, buf, root=0):
        data, _ = self._op("Bcast", _array(buf), root=root)
        _into(buf, data, _array(buf).nbytes)

    # pickling calls: the object crosses as data
    def send(self, obj, dest, tag=0):
        self._op("send", obj=obj, dest=dest, tag=tag)

    def recv(self, buf=None, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        obj, info = self._op("recv", source=source, tag=tag)
        _fill(status, info)
        return obj

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG,
                 status=None):
        obj, info = self._op("sendrecv", obj=sendobj, dest=dest, sendtag=sendtag, source=source, recvtag=recvtag)
        _fill(status, info)
        return obj

    def allreduce(self, sendobj, op=MPI.SUM):
        return self._op("allreduce", obj=sendobj, op=op_name(op))[0]

    def bcast(self, obj, root=0):
        return self._op("bcast", obj=obj, root=root)[0]

    def gather(self, sendobj, root=0):
        return self._op("gather", obj=sendobj, root=root)[0]

    def allgather(self, sendobj):
        return self._op("allgather", obj=sendobj)[0]

    # communicators
    def _made(self, handle, shape):
        return MPI.COMM_NULL if handle is None else ProxyComm(self._link, handle, *shape)

    def Split(self, color=0, key=0):
        return self._made(*self._op("Split", color=int(color), key=int(key)))

    def Split_type(self, split_type, key=0, info=None):
        return self._made(*self._op("Split_type", split_type=int(split_type), key=int(key)))

    def Dup(self):
        return self._made(*self._op("Dup"))

    def Free(self):
        self._op("Free")

    def Get_attr(self, keyval):
        return self._attributes.get(keyval)

    def Set_attr(self, keyval, value):
        self._attributes[keyval] = value

    def Delete_attr(self, keyval):
        self._attributes.pop(keyval, None)

    def Abort(self, errorcode=0):
        self._op("Abort", errorcode=int(errorcode))
        raise SystemExit(errorcode)

    def __repr__(self):
        return f"<communicator {self._handle} of the grader: rank {self._rank} of {self._size}>"


class ProxyRequest:
    """A nonblocking call's request, kept by the grader; ``Wait`` fills the receive buffer here."""

    def __init__(self, link, handle, buffer):
        self._link, self._handle, self._buffer, self._done = link, handle, buffer, False

    def _finish(self, data, info, status):
        if self._buffer is not None and info is not None:
            _into(self._buffer, data, info[2])
        _fill(status, info)
        self._done = True

    def Wait(self, status=None):
        if not self._done:
            data, info = self._link.op("Wait", self._handle, (), {})
            self._finish(data, info, status)
        return True

    wait = Wait

    def Test(self, status=None):
        if self._done:
            return True
        flag, (data, info) = self._link.op("Test", self._handle, (), {})
        if flag:
            self._finish(data, info, status)
        return bool(flag)

    test = Test

    def Cancel(self):
        self._link.op("Cancel", self._handle, (), {})

    def Free(self):
        self._done = True

    @staticmethod
    def Waitall(requests, statuses=None):
        for index, request in enumerate(requests):
            request.Wait(None if statuses is None else statuses[index])
        return True

    @staticmethod
    def Testall(requests, statuses=None):
        return all([request.Test() for request in requests])

    @staticmethod
    def Waitany(requests, status=None):
        while True:
            for index, request in enumerate(requests):
                if request.Test(status):
                    return index

    @staticmethod
    def Testany(requests, status=None):
        for index, request in enumerate(requests):
            if request.Test(status):
                return index, True
        return MPI.UNDEFINED, False


def install():
    """Make ``MPI.Request`` of this process the proxy's, before the student's code imports it."""
    MPI.Request = ProxyRequest
