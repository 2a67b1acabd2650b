"""SimComm: the part of mpi4py's Comm that the collectives use, on the simulated network.

    Get_rank, Get_size, rank, size       as mpi4py
    Send, Recv, Sendrecv                 blocking: the rank stops until its messages are done
    Isend, Irecv -> Request              Request.Wait, Request.Test, Request.Waitall(requests) (engine.py;
                                         not mpi4py's MPI.Request.Waitall, which takes MPI requests only)
    Barrier                              every rank waits for the last (costs no time)
    Split(color, key)                    a sub-communicator (one collective call, like MPI's)
    ranks_per_node                       the topology's c (collectives.hierarchical reads it)

Messages are matched by source and tag: MPI.ANY_SOURCE and MPI.ANY_TAG are refused (none of
the hearts uses them, and a wildcard's match would depend on the simulator's event order).
MPI.PROC_NULL is a partner that takes and gives nothing, as in MPI.
"""
from mpi4py import MPI

from .engine import Request, fill_status


class SimComm:
    """Rank `rank` of the engine's ranks; `members` maps this communicator's ranks to the engine's."""

    def __init__(self, engine, rank, members=None):
        self.engine = engine
        self.members = members                  # None: the whole world, rank i is engine rank i
        self.world_rank = rank if members is None else members[rank]
        self._rank = rank
        self._size = engine.topology.ranks if members is None else len(members)

    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return self._size

    rank = property(Get_rank)
    size = property(Get_size)

    @property
    def ranks_per_node(self):
        return self.engine.topology.ranks_per_node if self.members is None else None

    def _peer(self, peer, what):
        if peer == MPI.ANY_SOURCE or not isinstance(peer, int):
            raise NotImplementedError(f"the simulator needs an explicit {what} rank, got {peer!r}")
        if not 0 <= peer < self._size:
            raise ValueError(f"rank {self._rank}: {what} {peer} is not a rank of this {self._size}-rank communicator")
        return peer if self.members is None else self.members[peer]

    def Isend(self, buf, dest, tag=0):
        if dest == MPI.PROC_NULL:
            return _Null(self.engine, self.world_rank)
        return self.engine.start(self.world_rank, True, self._peer(dest, "destination"), tag, buf)

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):
        if source == MPI.PROC_NULL:
            return _Null(self.engine, self.world_rank)
        if tag == MPI.ANY_TAG:
            raise NotImplementedError("the simulator matches messages by tag: MPI.ANY_TAG is not supported")
        return self.engine.start(self.world_rank, False, self._peer(source, "source"), tag, buf)

    def Send(self, buf, dest, tag=0):
        if dest == MPI.PROC_NULL:
            self.engine.wait(self.world_rank, (self.Isend(buf, dest, tag),))
        else:                                    # blocking calls make no Request (engine.sendrecv)
            self.engine.blocking(self.world_rank, True, self._peer(dest, "destination"), tag, buf)

    Ssend = Send

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        if status is None and source != MPI.PROC_NULL and tag != MPI.ANY_TAG:
            self.engine.blocking(self.world_rank, False, self._peer(source, "source"), tag, buf)
            return
        request = self.Irecv(buf, source, tag)
        self.engine.wait(self.world_rank, (request,))
        if status is not None:
            fill_status(status, request)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG,
                 status=None):
        engine, me = self.engine, self.world_rank
        if status is None and self.members is None and dest >= 0 and source >= 0 and recvtag >= 0:
            engine.sendrecv(me, sendbuf, dest, sendtag, recvbuf, source, recvtag)    # the common case, quickly
            return
        send = self.Isend(sendbuf, dest, sendtag)
        receive = self.Irecv(recvbuf, source, recvtag)
        engine.wait(me, (send, receive))
        if status is not None:
            fill_status(status, receive)

    def Barrier(self):
        if self.members is not None:
            raise NotImplementedError("Barrier on a Split communicator is not simulated")
        self.engine.barrier(self.world_rank)

    def Split(self, color=0, key=0):
        """MPI_Comm_split on the whole world (every rank calls it): ranks with one color, ordered by
        (key, rank). Costs no simulated time. MPI.UNDEFINED gives None (MPI.COMM_NULL)."""
        if self.members is not None:
            raise NotImplementedError("Split of a Split communicator is not simulated")
        engine = self.engine
        choices = engine.__dict__.setdefault("split_choices", {})
        choices[self._rank] = (color, key)
        engine.barrier(self.world_rank)          # every rank's choice is in
        if color == MPI.UNDEFINED:
            result = None
        else:
            members = sorted((k, r) for r, (c, k) in choices.items() if c == color)
            members = [r for _, r in members]
            result = SimComm(engine, members.index(self._rank), members)
        engine.barrier(self.world_rank)          # every rank has read the choices
        choices.pop(self._rank, None)
        return result


class _Null(Request):
    """A request to or from MPI.PROC_NULL: done at once."""

    def __init__(self, engine, owner):
        super().__init__(engine, owner, True, -1, 0)
        self.done = engine.clock[owner]
