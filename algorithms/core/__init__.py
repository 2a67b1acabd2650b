"""What every algorithm module shares, split by concern:

    cli.py         the shared flags, the one validation helper, run_main (the error contract)
    objective.py   the network or convex problem one rank trains, as one flat parameter vector
    run.py         the agreed set-up, the one epoch loop, --save (``start`` returns a ``Run``)
    schedule.py    the large-batch schedules the run follows: the lr and the batch at every step
    log.py         the per-epoch log: printed on rank 0, --log as JSON lines
    step.py        the synchronous data-parallel step (allreduce SGD's, PBT's members', the bench's)
    divergence.py  a nan, inf or hundredfold loss stops every rank together, one message
    checkpoint.py  what --save writes and --resume reads (layout-free)
    evaluate.py    python -m algorithms.core.evaluate FILE: any checkpoint's test loss and accuracy
    tags.py        the MPI tags of every family, in one registry
    partition.py   a model cut into pieces across ranks (model parallelism, its hybrids and replicas)

How the memory-saving methods cut a model's state across ranks (ZeRO's units, the spatial split's
tiles and regions) serves only them and their memory accounts: it lives in algorithms/shards/.
"""
