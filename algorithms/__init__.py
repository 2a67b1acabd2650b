"""algorithms: one module per paper algorithm, each importable and runnable.

    mpiexec -n 4 python -m algorithms.<name> [--epochs N] [--lr X] [--batch-size B] [--seed S] ...
    params, history = algorithms.<name>.train(comm, ...)

What they share (flags, data, evaluation, logging, checkpoints) lives in ``algorithms.common``;
the parameter-server family also shares ``parameter_server`` and ``ps_job``. The README lists
the modules with their papers.
"""
