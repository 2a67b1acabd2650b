"""Emulated hosts: an MPI job across network namespaces on this machine, and the bytes on their links.

    netns.py   the hosts: one network namespace each, veth links to one bridge, tc's token bucket
               for the links' rate, their byte counters
    launch.py  ``python -m collectives.cluster``: the hosts built, the job started through a shim
               that plays ssh for the launcher (MPICH's hydra or Open MPI), what crossed the links

    sudo .venv/bin/python -m collectives.cluster --hosts 2 --ranks-per-host 2 --rate 1gbit -- \\
        .venv/bin/python -m algorithms.allreduce_sgd
"""
