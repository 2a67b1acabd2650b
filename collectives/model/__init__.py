"""The model the algorithms and the bench read: what an allreduce costs, by formula and as fitted here.

    cost.py         each algorithm's per-rank message and byte counts (tested against the tracer for
                    p = 1..8) and its alpha-beta-gamma time; the refined model at per-size rates;
    two_level.py    on nodes: every algorithm's time with a node's network ports shared by its ranks,
                    exactly as collectives.sim times it, and the two hierarchies' costs and counts
    calibration.py  the calibrated model: each kind of step's latency and per-byte rates at the
                    allreduce's own size and each algorithm's per-call overhead, read from
                    this machine's tuning file or the shipped calibration.json (``mpiexec -n 2 python -m
                    collectives.bench --calibrate`` writes the former)
    tuned.py        the user's tuning file's collectives section: the calibration and auto's selection
                    measured on this machine (``python -m minidl.tune``), keyed to it, read at import

    from collectives.model import cost
    cost.predict("ring", p, nbytes, alpha, beta, gamma)
"""
