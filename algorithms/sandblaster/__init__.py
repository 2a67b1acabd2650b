"""The pieces of Sandblaster L-BFGS; algorithms/sandblaster_lbfgs.py holds its header, its heart
(``sharded_direction``, the two-loop recursion as shard commands) and ``train``.

    wire.py         who is what (``Roles``: coordinator, shards, workers) and the messages' tags
    coordinator.py  rank 0: L-BFGS on the shards, numbers only (``Shards``, ``Coordinator``)
    shard.py        a parameter-server shard: its slice of every vector and of the history, the pushes
    batch.py        one batch's portions, pushes and backup tasks, as the coordinator keeps them
    worker.py       a worker: portions of each batch, pushed every few

The parameter server's polling (``POLL_SECONDS``, ``wait_for``) and its ranges (``shard_ranges``)
are the ps wire's (algorithms/ps/wire.py).
"""
