"""algorithms: one module per paper algorithm, each importable and runnable.

    mpiexec -n 4 python -m algorithms.<name> [--epochs N] [--lr X] [--batch-size B] [--seed S] ...
    params, history = algorithms.<name>.train(comm, ...)

Every algorithm module reads the same way: a header (the paper, the update in the code's names,
the cost, the run command), the heart (one function, fenced ``# BEGIN SOLUTION`` /
``# END SOLUTION``, the paper's steps as phase comments), a short ``train()`` and ``main()``.
The papers sit at the top of the package, one module each; README.md's table lists them with
their papers, and CONTRIBUTING.md says how to add one (three files: the module, its test, its row).
Beside them, the commands that run or measure several of them:

    compare.py    python -m algorithms.compare: the data-parallel algorithms (each declares
                  ``COMPARE = True``) on the same data and seed, one PNG
    bench.py      python -m algorithms.bench: allreduce SGD's step against PyTorch DDP

and the rooms, each with its own map (its ``__init__.py``):

    core/         what every algorithm shares: the flags and the error contract, the objective, the
                  run (the one epoch loop, its schedule and log), checkpoints, divergence, MPI tags,
                  a model cut across ranks, the data-parallel step
    shards/       how the memory-saving methods cut a model's state across ranks: ZeRO's units, the
                  spatial split's row tiles, the locally connected regions (theirs and memory/'s)
    ps/           the parameter-server machinery of Downpour, SSP, async EASGD and the hierarchical server
    sandblaster/  the roles of Sandblaster L-BFGS (coordinator, shards, workers)
    memory/       the per-rank memory accounts, predicted and measured: python -m algorithms.memory

Nothing in core/, shards/, ps/ or sandblaster/ imports a paper module; a paper imports them (and,
where it builds on another paper's heart, that module). Rank sharding and batching are data
(``minidl.data.rank_batches``); collectives come from ``collectives``.
"""
