"""The tools that measure: every allreduce against MPI's own and against the model.

    measure.py       ``python -m collectives.bench``: each algorithm's time per call beside
                     MPI_Allreduce's, the cost model's, the refined and the calibrated model's, with
                     the performance targets; --calibrate fits the calibrated model first
    flags.py         its flags, checked on every rank, and the targets a row is judged by
    rows.py          a row from its interleaved rounds: each figure the median, each ratio's [min, max]
    calibrate.py     the micro-benchmarks the model is fitted on: the ping-pong (alpha, beta), the add
                     (gamma), the per-size rates, and the calibration's step times at each size
    plot.py          ``--plot``: time against size, measured and modelled
    mpich_choice.py  ``python -m collectives.bench.mpich_choice``: MPICH's own algorithms forced one by
                     one, beside ours

    mpiexec -n 4 python -m collectives.bench --json bench.json --plot bench.png
    python -m collectives.bench.mpich_choice -n 4 --size 16K --ours auto
"""
