"""Sandblaster's wire: who is what, and the tag of each kind of message.

    roles = Roles(size, servers, n_params)     # rank 0 coordinates, ranks 1 .. S serve, the rest work

    tag         from -> to                what
    CMD         coordinator -> shard      a command (op, args): a vector operation or a reduction
    REPLY       shard -> coordinator      one number: a partial sum, a max, an acknowledgement
    REPORT      worker -> coordinator     a finished portion (its loss) and the worker's bytes sent
    WORK        coordinator -> worker     keep / drop / push, and the next portion (or stop)
    PUSH        worker -> shard           how many portions the accumulated gradient holds ...
    PUSH_DATA   worker -> shard           ... and the gradient's slice, a raw buffer
    FETCH       worker -> shard           a request for the batch's trial point
    PARAMS      shard -> worker           the trial point's slice, a raw buffer

The coordinator's messages (CMD, REPLY, REPORT, WORK) carry numbers and small dicts only, never a
vector; the vectors go between workers and shards (tests/test_sandblaster.py checks both).
"""
from algorithms.core import cli, tags
from algorithms.ps.wire import shard_ranges

CMD, REPLY, REPORT, WORK = tags.SB_CMD, tags.SB_REPLY, tags.SB_REPORT, tags.SB_WORK
PUSH, PUSH_DATA, FETCH, PARAMS = tags.SB_PUSH, tags.SB_PUSH_DATA, tags.SB_FETCH, tags.SB_PARAMS


class Roles:
    """Rank 0 coordinates, ranks 1 .. S serve the shards, ranks S+1 .. p-1 work."""

    def __init__(self, size, servers, n_params):
        if size < servers + 2:
            raise cli.SettingError(f"{size} ranks cannot hold a coordinator, {servers} server(s) and a worker; "
                                   f"run with mpiexec -n {servers + 2} or more, or fewer --servers")
        self.size, self.servers = size, servers
        self.ranges = shard_ranges(n_params, servers)
        self.server_ranks = list(range(1, servers + 1))
        self.worker_ranks = list(range(servers + 1, size))
        self.workers = len(self.worker_ranks)

    def role(self, rank):
        return "coordinator" if rank == 0 else "server" if rank <= self.servers else "worker"
