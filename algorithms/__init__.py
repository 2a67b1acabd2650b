"""algorithms: one module per paper algorithm, each importable and runnable.

    mpiexec -n 4 python -m algorithms.<name> [--epochs N] [--lr X] [--batch-size B] [--seed S] ...
    params, history = algorithms.<name>.train(comm, ...)

Every algorithm module reads the same way: a header (the paper, the update in the code's names,
the cost, the run command), the heart (one function, fenced ``# BEGIN SOLUTION`` /
``# END SOLUTION``, the paper's steps as phase comments), a short ``train()`` and ``main()``.
The papers sit at the top of the package; the machinery they share lives once, split by concern,
in two sub-packages:

    core/   cli.py        the shared flags, the one validation helper, run_main (the error contract)
            objective.py  the network or convex problem one rank trains, as one flat parameter vector
            run.py        the agreed set-up, the one epoch loop, checkpoints
            log.py        the per-epoch log: printed on rank 0, --log as JSON lines
            divergence.py a nan, inf or hundredfold loss stops every rank together, one message
            checkpoint.py what --save writes and --resume reads (layout-free)
            tags.py       the MPI tags of every family, in one registry
            evaluate.py   python -m algorithms.core.evaluate FILE: any checkpoint's test loss and accuracy
            compare.py    python -m algorithms.core.compare: several algorithms on the same data, one PNG
            partition.py  a model cut into pieces across ranks (model parallelism, its hybrids and replicas)
    ps/     server.py     the sharded server's algorithm      wire.py      requests, replies, the layout
            job.py        start, serve or work, end           worker.py    a worker's share, steps, failure
            relay.py      --groups: a group server            log.py       rank 0's per-epoch log
            replica.py    model-parallel replicas as workers  schedule.py  --deterministic's order
            loop.py       the asynchronous family's job loop: each rank plays its role, all end together

Sandblaster L-BFGS keeps its roles' code beside it, in ``sandblaster/`` (wire, coordinator, shard,
batch, worker); ``sandblaster_lbfgs.py`` holds the header, the heart and ``train``, which runs the
roles through the parameter-server family's job loop (``ps.loop``) and its polling (``ps.wire``).

Rank sharding and batching are data (``minidl.data.rank_batches``); collectives come from
``collectives``. The README lists the modules with their papers.
"""
