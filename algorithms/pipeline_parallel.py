"""Pipeline-parallel SGD: the layers cut into P stages (one per rank), each batch into m micro-batches.

    mpiexec -n 4 python -m algorithms.pipeline_parallel [--schedule gpipe|1f1b] [--micro-batches 4]

Papers: Ben-Nun & Hoefler 2019 (pipeline parallelism: the layers are distributed, only
neighbouring stages communicate, the mini-batch flows through every processor); Huang et al. 2019
(GPipe: micro-batches, every forward then every backward, gradients accumulated over the
micro-batches and applied once, "synchronous" so the result is exactly mini-batch SGD); Narayanan
et al. 2021 (1F1B with a flush, "PipeDream-Flush": the same arithmetic, backwards started as early
as possible, so a stage keeps at most P micro-batches' activations instead of m). Full references:
tutorials/references.md.

The model (a Sequential of L layers) is cut into P contiguous stages of L/P layers (the first
stages take one more when P does not divide L); stage s runs on rank s. One global batch of b
rows (--batch-size) is cut into m micro-batches of about b/m rows (``shard``). For micro-batch i:

    forward  i on stage s:  x_s,i  = receive from stage s-1 (stage 0: the input rows)
                            x_s+1,i = layers_s(x_s,i)   -> sent to stage s+1 (last stage: the loss)
    backward i on stage s:  g_s+1,i = receive from stage s+1 (last stage: d loss_i, below)
                            grad_s += d/dw_s, g_s,i = d/dx_s,i   -> g_s,i sent to stage s-1
    loss_i = (rows_i / b) * mean cross-entropy over micro-batch i, so sum_i loss_i = the batch mean

and after the last backward every stage applies one update to its own layers:
w_s <- w_s - lr * grad_s (with momentum, through v_s). Since grad_s = d(sum_i loss_i)/dw_s is
serial SGD's gradient at batch b, P stages x m micro-batches == serial SGD at batch b, up to the
order of the additions, for either schedule (``schedule``, the heart). A stage keeps x_s,i and the
graph of layers_s(x_s,i) from forward i until backward i: that is the activation memory the two
schedules differ in.

    GPipe, P = 3, m = 4 (F = forward, B = backward, . = bubble; one slot each)
    stage 0  F0 F1 F2 F3 .  .  .  .  B3 B2 B1 B0
    stage 1  .  F0 F1 F2 F3 .  .  B3 B2 B1 B0 .
    stage 2  .  .  F0 F1 F2 F3 B3 B2 B1 B0 .  .        holds m = 4 micro-batches at its peak

    1F1B, P = 3, m = 4
    stage 0  F0 F1 F2 .  .  B0 F3 B1 .  B2 .  B3       warm-up P-s-1 = 2 forwards, then
    stage 1  .  F0 F1 .  B0 F2 B1 F3 B2 .  B3 .        one forward, one backward (steady state),
    stage 2  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .        cool-down: the backwards still owed;
                                                       stage s holds at most P - s micro-batches
    (each slot as early as its input allows: a stage waits for the forward from s-1, the backward
    from s+1; tests/test_pipeline_parallel.py replays ``schedule`` this way and checks both pictures)
With forward and backward of equal cost, both schedules leave each stage idle for (P-1) of the
(m+P-1) slots of each pass: the bubble fraction (P-1)/(m+P-1) (Huang et al. 2019).

Communication per step: every micro-batch crosses every boundary twice (its activation forward,
its gradient backward), so the ranks together send 2 b (sum over boundaries of the boundary's
width) * itemsize bytes per step, in 2 m (P-1) messages; no parameters move (``bytes_per_step``).
Every send is an Isend that the step waits on at its end: with blocking sends 1F1B could deadlock
(stage s sending an activation to s+1 while s+1 sends a gradient back). Per micro-batch and
direction each message has its own tag, so no receive can take another micro-batch's message.

Every rank holds the whole flat parameter vector (the same initial weights as serial SGD), but
computes only its stage's slice of the gradient; the other slices' gradient is zero. The optimizer
steps the whole vector, so within an epoch those other slices are stale copies: without momentum
they stay as they are, with momentum they drift (v <- momentum v, w <- w - lr v, from the momentum
gathered at the last epoch's end). Nothing reads them: stage s's forward and backward use only its
own layers. At each epoch's end every stage's slice and its momentum are gathered on every rank
(``share_stages``; evaluation only, not counted), which overwrites the stale copies, so every rank
evaluates, saves and returns the whole trained model, and a --save file is the serial model's.

--recompute (Huang et al. 2019's re-materialization; Chen et al. 2016): each stage runs as one
checkpointed segment (``minidl.recompute``), so a micro-batch in flight keeps only the stage's input
and output, and its backward runs the stage's forward again first: the same bits, the activations
in flight m (GPipe) or P - s (1F1B) stage inputs and outputs plus one micro-batch's stage at a time
(``algorithms.memory.accounts`` predicts the bytes, ``algorithms.memory`` measures them).

Restrictions: P <= L (a stage needs a layer); 1 <= m <= --batch-size (a micro-batch needs a row;
the epoch's last, shorter batch uses min(m, its rows)); a Sequential model (not --problem). Stages
are cut by layer count, not balanced by cost as GPipe's partitioner does.

Default run (the defaults ``--help`` shows): the same trajectory as serial SGD at batch 32, for any P <= 8;
measured at P = 4: 98.9% test accuracy, as serial SGD's 20 epochs (the final training losses agree to 2e-8; 40
s with other jobs on the 2 cores, against 14 s serially: 4 ranks share 2 cores, and the bubble).
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli, tags
from algorithms.core.cli import SettingError
from algorithms.core.objective import build_model
from algorithms.core.run import Run, Settings
from minidl import backend, functional as F
from minidl.data import shard
from minidl.nn import Sequential
from minidl.recompute import Checkpoint
from minidl.tensor import Tensor, no_grad

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9)

SCHEDULES = ("gpipe", "1f1b")
ACTIVATION, GRADIENT = tags.PIPELINE, tags.PIPELINE + 1   # micro-batch i: ACTIVATION + 2 i and GRADIENT + 2 i
MAX_MICRO_BATCHES = tags.PIPELINE_MICRO_BATCHES       # keeps every tag in the pipeline's range (algorithms.core.tags)


def schedule(kind, stage, stages, micro_batches):
    """The order of stage ``stage``'s work on one global batch (the heart): a list of
    ("forward", i) and ("backward", i), i = 0 .. micro_batches-1.

    gpipe: every forward, then every backward (the last micro-batch first).
    1f1b:  warm-up: the forwards that fill the stages after this one, min(P - s - 1, m);
           steady state: one forward, one backward, until the forwards run out;
           cool-down: the backwards still owed. Backwards in the order of the forwards.
    """
    # BEGIN SOLUTION
    m = micro_batches
    if kind == "gpipe":
        # fill: all m forwards; drain: all m backwards, newest first
        return [("forward", i) for i in range(m)] + [("backward", i) for i in reversed(range(m))]
    # warm-up: the later stages each need one micro-batch before the last stage can turn one back
    warmup = min(stages - stage - 1, m)
    order = [("forward", i) for i in range(warmup)]
    # steady state: forward warmup + i, then backward i: at most warmup + 1 <= P - s held at once
    for i in range(m - warmup):
        order += [("forward", warmup + i), ("backward", i)]
    # cool-down: the backwards of the micro-batches still held
    order += [("backward", i) for i in range(m - warmup, m)]
    return order
    # END SOLUTION


class Stage:
    """Rank ``stage``'s part of the network: layers [first, stop), their slice [start, end) of the flat
    parameter vector, the feature shapes it receives and sends, and the most micro-batches it held."""

    def __init__(self, net, stage, stages, sample, recompute=False):
        self.stage, self.stages = stage, stages
        self.bounds = [stage_layers(len(net), s, stages) for s in range(stages)]
        layers = list(net)
        # the feature shape entering each layer (and leaving the last): one row through the network
        self.shapes = [tuple(sample.shape[1:])]
        with no_grad():
            x = Tensor(backend.asarray(sample))
            for layer in layers:
                x = layer(x)
                self.shapes.append(tuple(x.shape[1:]))
        # each stage's slice of the flat parameters: parameters are flattened in layer order
        sizes = [sum(p.size for p in layer.parameters()) for layer in layers]
        self.slices = [(sum(sizes[:first]), sum(sizes[:stop])) for first, stop in self.bounds]
        first, stop = self.bounds[stage]
        self.layers = Sequential(*layers[first:stop])
        if recompute:       # --recompute: the whole stage one segment, its input kept (GPipe's re-materialization)
            self.layers = Checkpoint(self.layers)
        self.receives, self.sends = self.shapes[first], self.shapes[stop]
        self.start, self.end = self.slices[stage]
        self.first, self.last = stage == 0, stage == stages - 1
        self.peak_held = 0


def stage_layers(layers, stage, stages):
    """(first, stop): the layers of ``stage`` out of ``stages`` contiguous, near-equal stages."""
    own = shard(layers, stage, stages)
    return int(own[0]), int(own[-1]) + 1


def pipeline_gradient(comm, stage, objective, batch, micro_batches, kind):
    """This stage's gradient of the global batch ``batch`` (into ``objective.grad``), by running
    ``schedule(kind, ...)``; returns the mean loss over the batch's rows on the last stage (0 on the
    others: ``train`` broadcasts the last stage's for the log)."""
    rows = batch.index
    pieces = [rows[shard(len(rows), i, min(micro_batches, len(rows)))] for i in range(min(micro_batches, len(rows)))]
    x_data, y_data = objective.data.x_train, objective.data.y_train
    dtype = objective.params.dtype
    objective.grad[...] = 0
    held, sending, loss_sum = {}, [], 0.0         # held: micro-batch -> (input, output) until its backward
    for step, i in schedule(kind, stage.stage, stage.stages, len(pieces)):
        if step == "forward":
            if stage.first:
                x = Tensor(backend.asarray(x_data[pieces[i]]))
            else:
                buffer = numpy.empty((len(pieces[i]),) + stage.receives, dtype=dtype)
                comm.Recv(buffer, source=stage.stage - 1, tag=ACTIVATION + 2 * i)
                x = Tensor(backend.asarray(buffer), requires_grad=True)
            out = stage.layers(x)
            if stage.last:                        # loss_i = (rows_i / b) * mean cross-entropy of micro-batch i
                loss = F.softmax_cross_entropy(out, backend.asarray(y_data[pieces[i]]))
                loss_sum += loss.item() * len(pieces[i])
                out = loss * (len(pieces[i]) / batch.total)
            else:
                sending.append(isend(comm, out.data, stage.stage + 1, ACTIVATION + 2 * i))
            held[i] = (x, out)
            stage.peak_held = max(stage.peak_held, len(held))
        else:
            x, out = held.pop(i)                  # the activations of micro-batch i are freed here
            if stage.last:
                gradient = None                   # d(sum loss)/d loss_i = 1
            else:
                gradient = numpy.empty((len(pieces[i]),) + stage.sends, dtype=dtype)
                comm.Recv(gradient, source=stage.stage + 1, tag=GRADIENT + 2 * i)
                gradient = backend.asarray(gradient)
            if out.requires_grad:                 # false only for a first stage without parameters
                out.backward(gradient)            # grad_s += d loss_i / dw_s (accumulates)
            if not stage.first:
                sending.append(isend(comm, x.grad, stage.stage - 1, GRADIENT + 2 * i))
    MPI.Request.Waitall([request for request, _ in sending])
    return loss_sum / max(len(rows), 1)


def isend(comm, array, destination, tag):
    """Isend a host copy of ``array``; returns (request, buffer): the buffer must live until the wait."""
    buffer = numpy.ascontiguousarray(backend.to_numpy(array))
    return comm.Isend(buffer, dest=destination, tag=tag), buffer


def share_stages(comm, stage, objective, optimizer):
    """Every stage's trained slice (and its momentum) onto every rank of the pipeline ``comm``."""
    counts = [end - start for start, end in stage.slices]
    vectors = [objective.params] + [state["momentum"] for state in optimizer.state if "momentum" in state]
    for vector in vectors:
        own = numpy.ascontiguousarray(backend.to_numpy(vector[stage.start:stage.end]))
        whole = numpy.empty(sum(counts), dtype=own.dtype)
        comm.Allgatherv(own, [whole, counts])
        vector[...] = backend.asarray(whole)


def bytes_per_step(rows, stage_widths, itemsize):
    """Bytes all ranks send in one step: each row's activation and gradient across each boundary.

    ``stage_widths``: the number of features crossing each of the P-1 boundaries.
    """
    return 2 * rows * sum(stage_widths) * itemsize


def check(settings, stages, kind, micro_batches):
    """The pipeline's own settings, checked on every rank before the first message."""
    if kind not in SCHEDULES:
        raise SettingError(f"unknown --schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    cli.require("--micro-batches", micro_batches, integer=True, low=1, high=MAX_MICRO_BATCHES)
    if micro_batches > settings.batch_size:
        raise SettingError(f"--micro-batches {micro_batches} is more than --batch-size {settings.batch_size}: "
                           f"every micro-batch needs at least one row")
    if settings.problem is not None:
        raise SettingError("pipeline parallelism needs a network of layers, not a convex problem")
    model = settings.model
    net = model() if callable(model) else build_model(model, settings.seed, settings.dataset)
    if not isinstance(net, Sequential):
        raise SettingError(f"pipeline parallelism cuts a Sequential into stages, got a {type(net).__name__}")
    if stages > len(net):
        raise SettingError(f"{stages} stages (ranks) but the model has only {len(net)} layers: "
                           f"every stage needs at least one (use at most {len(net)} ranks)")


def train(comm=None, schedule="1f1b", micro_batches=4, recompute=False, **settings):
    """Pipeline-parallel SGD on ``comm`` (rank s = stage s); returns (final flat parameters, history).

    ``--batch-size`` is the pipeline's global batch (the one replica's), cut into ``micro_batches``.
    Every rank returns the whole trained parameter vector. ``recompute``: each stage one checkpointed
    segment (the same bits, fewer activations in flight).
    """
    comm = comm or MPI.COMM_WORLD
    kind = schedule                                # the argument's name hides the function schedule() here
    settings = Settings.of(settings, **DEFAULTS)
    writer = checkpoint.Writer("pipeline_parallel", checkpoint.SGD_FAMILY,
                               layout={"stages": comm.Get_size(), "schedule": kind, "micro_batches": micro_batches})
    run = Run.start(comm, settings, check=lambda s: check(s, comm.Get_size(), kind, micro_batches),
                    reader=(0, 1), writer=writer)
    stage = Stage(run.objective.net, run.rank, run.size, run.objective.data.x_train[:1], recompute)
    last = run.size - 1

    def step(batch):
        loss = pipeline_gradient(run.counting, stage, run.objective, batch, micro_batches, kind)
        run.optimizer.step()                       # w_s <- w_s - lr * grad_s: only this stage's slice moves
        return run.comm.bcast(loss, root=last)     # the loss the last stage saw, for the log

    def evaluate():
        share_stages(run.comm, stage, run.objective, run.optimizer)
        return run.objective.evaluate()

    return run.loop(step, evaluate=evaluate)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], recompute="stage", **DEFAULTS)
    parser.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                        help="gpipe: all forwards, then all backwards; 1f1b: one forward, one backward")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per global batch")
    args = parser.parse_args(argv)
    cli.run_main(train, args, schedule=args.schedule, micro_batches=args.micro_batches)


if __name__ == "__main__":
    main()
