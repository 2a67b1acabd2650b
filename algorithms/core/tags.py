"""MPI tags of algorithms/, in one registry (collectives/ keeps its own: collectives/tags.py).

Each family sends with its own tags, so a message of one role can never be taken by a receive
of another, even when a fast rank is a step ahead. The ranges are disjoint from one another and
from the collectives' (tests/test_tags.py checks it), and below 32767, the largest tag every MPI
must allow. A range ``(first, count)`` holds ``count`` tags from ``first``: the pipeline's tags
are per micro-batch, PBT's per member.
"""

# the parameter-server wire (algorithms.ps.wire): requests, pushed gradients, replies, parameters,
# control messages, epoch snapshots, epoch ends
PS_REQUEST, PS_GRAD, PS_REPLY, PS_PARAMS, PS_CONTROL, PS_SNAPSHOT, PS_EPOCH = range(501, 508)
# Sandblaster (algorithms.sandblaster.wire): coordinator commands and replies, workers' reports,
# work orders, pushes and their data, fetches and parameters
SB_CMD, SB_REPLY, SB_REPORT, SB_WORK, SB_PUSH, SB_PUSH_DATA, SB_FETCH, SB_PARAMS = range(601, 609)
GOSSIP = 7201                   # gossip SGD: partners swap parameter vectors
PBT_EXPLOIT = 7301              # PBT: a winner's [w, v] to its loser, tag PBT_EXPLOIT + loser
PBT_MEMBERS = 600               # at most this many members, so PBT's range ends at 7900
MODEL_PARALLEL = 7901           # model parallelism: every partition-crossing message
SPATIAL_HALO = 7950             # spatial split: halo rows to a neighbour, and their gradients back
SPATIAL_GATHER = 7951           # spatial split: the last map's tiles to every rank, before the head
PIPELINE = 8000                 # pipeline: micro-batch i's activation 8000 + 2 i, its gradient 8001 + 2 i
PIPELINE_MICRO_BATCHES = 10000  # at most this many micro-batches: the last tag is 27999

RANGES = {                      # name: (first tag, how many)
    "parameter-server wire": (PS_REQUEST, 7),
    "Sandblaster": (SB_CMD, 8),
    "gossip": (GOSSIP, 1),
    "PBT exploit": (PBT_EXPLOIT, PBT_MEMBERS),
    "model parallelism": (MODEL_PARALLEL, 1),
    "spatial split": (SPATIAL_HALO, 2),
    "pipeline": (PIPELINE, 2 * PIPELINE_MICRO_BATCHES),
}
