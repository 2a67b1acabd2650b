"""algorithms: one module per paper algorithm, each importable and runnable.

    mpiexec -n 4 python -m algorithms.<name> [--epochs N] [--lr X] [--batch-size B] [--seed S] ...
    params, history = algorithms.<name>.train(comm, ...)

Every algorithm module reads the same way: a header (the paper, the update in the code's names,
the cost, the run command), the heart (one function, fenced ``# BEGIN SOLUTION`` /
``# END SOLUTION``, the paper's steps as phase comments), a short ``train()`` and ``main()``.
What they share lives once, split by concern:

    cli.py        the shared flags, the one validation helper, run_main (the error contract)
    objective.py  the network or convex problem one rank trains, as one flat parameter vector
    run.py        the agreed set-up, the one epoch loop, the log, checkpoints, the nan check

Rank sharding and batching are data (``minidl.data.rank_batches``); collectives come from
``collectives``. The parameter-server family also shares ``parameter_server`` (the server's
algorithm), ``ps_wire`` (tags, requests and replies, the layout), ``ps_job`` (start, serve or
work, collect) and ``ps_log`` (rank 0's per-epoch log). The README lists the modules with their papers.
"""
