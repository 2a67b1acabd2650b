"""The parameter-server machinery that Downpour, SSP, async EASGD and the hierarchical server share:

    server.py    the sharded server's algorithm      wire.py      requests, replies, the layout
    job.py       start, serve or work, end           worker.py    a worker's share, steps, failure
    relay.py     --groups: a group server            log.py       rank 0's per-epoch log
    replica.py   model-parallel replicas as workers  schedule.py  --deterministic's order
    loop.py      the asynchronous family's job loop: each rank plays its role, all end together
    flags.py     the family's own flags (--servers, --server-optimizer, --deterministic, ...)
"""
