"""MPI tags, one per phase of a collective, and the phase names the tracer prints.

Every phase of every algorithm sends with its own tag. That does two jobs:

- correctness: a message of one phase can never be matched by a receive of another phase,
  even when a fast rank is already one phase (or one call) ahead of its neighbour;
- tracing: `collectives.trace` turns the tag of each recorded message back into the phase
  name ("reduce-scatter", "allgather", ...), and knows whether the receiver reduces what it
  receives (so a trace can count the bytes reduced, the gamma term of the cost model).

The values are arbitrary but unusual, so they do not collide with tags a user program may
already send on the same communicator.
"""

CHECK = 7101            # the agreement check on lengths and dtypes (collectives.check)
FOLD_IN = 7102          # non-power-of-two: even rank hands its vector to its odd neighbour
FOLD_OUT = 7103         # non-power-of-two: odd rank hands the result back
GATHER = 7104           # naive: every rank sends its vector to the root
SEND_BACK = 7105        # naive: the root sends the result to every rank
REDUCE = 7106           # binomial tree: child sends its partial result to its parent
BROADCAST = 7107        # binomial tree: parent sends the result to its children
EXCHANGE = 7108         # butterfly: partners swap whole vectors
REDUCE_SCATTER = 7109   # ring and Rabenseifner: blocks travel and are reduced
ALLGATHER = 7110        # ring and Rabenseifner: reduced blocks travel and are copied
SPARSE_FOLD_IN = 7131   # sparse allreduce (sparse.py): even rank hands its (index, value) pairs over
SPARSE_EXCHANGE = 7132  # sparse allreduce: partners swap sparse or dense vectors and merge them
SPARSE_FOLD_OUT = 7133  # sparse allreduce: odd rank hands the result back
DIRECT_GATHER = 7134    # sparse.allgather: every rank's block straight to every other rank
PING_PONG = 7140        # collectives.bench: rank 0 and rank 1 bounce a message to fit alpha and beta

# tag -> (phase name, whether the receiver combines the incoming data into its own)
PHASES = {
    CHECK: ("check", True),
    FOLD_IN: ("fold-in", True),
    FOLD_OUT: ("fold-out", False),
    GATHER: ("gather", True),
    SEND_BACK: ("send-back", False),
    REDUCE: ("reduce", True),
    BROADCAST: ("broadcast", False),
    EXCHANGE: ("exchange", True),
    REDUCE_SCATTER: ("reduce-scatter", True),
    ALLGATHER: ("allgather", False),
    SPARSE_FOLD_IN: ("sparse fold-in", True),
    SPARSE_EXCHANGE: ("sparse exchange", True),
    SPARSE_FOLD_OUT: ("sparse fold-out", False),
    DIRECT_GATHER: ("direct allgather", False),
    PING_PONG: ("ping-pong", False),
}
