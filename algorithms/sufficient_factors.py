"""Sufficient-factor broadcasting: a Linear layer's gradient sent as its two factors, peer to peer.

    mpiexec -n 4 python -m algorithms.sufficient_factors --batch-size 8          # factors where they pay
    mpiexec -n 4 python -m algorithms.sufficient_factors --factors always
    mpiexec -n 4 python -m algorithms.sufficient_factors --exchange server --batch-size 32

Papers: Xie, Kim, Zhou, Ho, Kumar, Yu & Xing, "Distributed Machine Learning via Sufficient Factor
Broadcasting" (2016); Zhang et al., "Poseidon" (USENIX ATC 2017), which picks factors or the full
matrix per layer by their cost; Ben-Nun & Hoefler 2019 ("send FC factors (p_{m-1}, p_m) ...
broadcast factors to not receive full w"). Full references: tutorials/references.md.

A Linear layer y = x W (x: batch x in, W: in x out) has, over a batch of B rows, the gradient

    dW = sum_i x_i^T delta_i = x^T delta        (in x out), delta = d loss / d y  (B x out)

so the B x (in + out) numbers (x, delta) determine the in x out numbers of dW. In the code's
names (``sufficient_factor_step``), at step k on rank r:

    grad_r        = (|index| / total) * mean gradient on this rank's piece         (as allreduce_sgd)
    rest          = sum_r grad_r[every entry but the factored weights]           (one dense allreduce)
    (x_s, d_s)    for every rank s: its layer inputs and (|index_s| / total) delta_s, sent by s to
                  every other rank (p - 1 Sendrecv rounds, ``broadcast_factors``)
    dW            = X^T D, X and D every rank's rows stacked in rank order: the same bits everywhere
    w            <- optimizer.step()

Bytes per step on rank r, for factored layers l with in_l, out_l and B_r rows on this rank:

    factors:  (p - 1) B_r sum_l (in_l + out_l) s        against the allreduce's 2 (p - 1)/p in_l out_l s

so a layer's factors pay when (p - 1) B (in + out) < 2 (p - 1)/p in out (``factors_pay``).

--exchange server (``server_factor_step``): a synchronous sharded server, one shard per factored
layer, served by rank (layer number mod p) beside its own work (not chapter 5's asynchronous
server). Every other rank pushes its factors of that layer to the owner, the owner forms
dW = X^T D from all of them in rank order and sends dW back (what a worker would pull):

    push:  B_r (in + out) s bytes from each rank but the owner     (instead of in out s)
    pull:  (p - 1) in out s bytes from the owner

so the factors pay on the push when B (in + out) < in out: the slides' rule (which is also the
broadcast rule at p = 2). --factors auto follows the exchange's rule per layer, always / never
force it. B is the per-rank batch of the epoch: with --batch-schedule it grows at the --lr-decay
epochs, and the choice and the size of the receive buffers (B sum_l (in_l + out_l) numbers, no
piece has more rows) are made again for each batch size; an epoch's shorter last step keeps its
epoch's choice.

Restrictions: the model's top-level Sequential entries that are Linear layers can be factored
(the MLP's three, the CNN's last); host (NumPy) arrays; p <= number of training examples.
"""
import numpy
from mpi4py import MPI

from algorithms.core import checkpoint, cli
from algorithms.core.cli import SettingError
from algorithms.core.run import Run, Settings, allreduce_function
from collectives.tags import DIRECT_GATHER, GATHER, SEND_BACK
from minidl import backend
from minidl.nn import Linear, Module, Sequential
from minidl.tensor import Tensor

# the shared flags' defaults for this algorithm, for train() and --help alike
DEFAULTS = dict(epochs=20, momentum=0.9, partition="global", model="mlp")

CHOICES = ("auto", "always", "never")
EXCHANGES = ("broadcast", "server")


def factors_pay(batch, fan_in, fan_out, p, exchange="broadcast"):
    """True when sending a layer's factors costs fewer bytes than sending its gradient: broadcast to
    p - 1 peers against the allreduce of dW, or (server) one push of factors against one of dW."""
    if exchange == "server":
        return p > 1 and batch * (fan_in + fan_out) < fan_in * fan_out
    return p > 1 and (p - 1) * batch * (fan_in + fan_out) < 2 * (p - 1) / p * fan_in * fan_out


class Factored(Module):
    """A Linear layer that keeps its sufficient factors: ``x`` (its input) and ``delta`` (d loss / d y).

    delta is read from a zero ``probe`` added to the output: y + 0 has the bits of y, and the probe's
    gradient after backward() is exactly the gradient that reached y.
    """

    def __init__(self, linear):
        super().__init__()
        self.linear = linear
        self.x, self.probe = None, None

    def forward(self, x):
        out = self.linear(x)
        if not out.requires_grad:                          # evaluation (no_grad): no factors to keep
            return out
        self.x = x.data
        self.probe = Tensor(numpy.zeros(out.shape, dtype=out.dtype), requires_grad=True)
        return out + self.probe

    @property
    def delta(self):
        return self.probe.grad


def factor_linear_layers(net, choose):
    """Wrap the top-level Linear entries of the Sequential ``net`` for which ``choose(layer)`` is true,
    in place and keeping the order of the parameters; returns the wrappers."""
    if not isinstance(net, Sequential):
        return []
    wrapped = []
    for name, layer in list(net._modules.items()):
        if isinstance(layer, Linear) and choose(layer):
            net._modules[name] = Factored(layer)          # same key, same place: the order stays
            object.__setattr__(net, name, net._modules[name])
            wrapped.append(net._modules[name])
    return wrapped


def broadcast_factors(comm, block, largest):
    """Every rank's ``block`` (1-D, at most ``largest`` elements, lengths may differ), in rank order:
    p - 1 Sendrecv rounds, at round j to rank + j and from rank - j; the length read from the status."""
    rank, size = comm.Get_rank(), comm.Get_size()
    blocks = [None] * size
    blocks[rank] = block
    for step in range(1, size):
        source = (rank - step) % size
        incoming = numpy.empty(largest, dtype=block.dtype)
        status = MPI.Status()
        comm.Sendrecv(block, (rank + step) % size, DIRECT_GATHER, incoming, source, DIRECT_GATHER, status)
        blocks[source] = incoming[:status.Get_count(MPI.BYTE) // block.itemsize]
    return blocks


def receive_factors(comm, source, largest, dtype, tag):
    """One rank's factors block (at most ``largest`` elements), its length read from the status."""
    incoming = numpy.empty(largest, dtype=dtype)
    status = MPI.Status()
    comm.Recv(incoming, source, tag, status)
    return incoming[:status.Get_count(MPI.BYTE) // incoming.itemsize]


def pack_factors(layers, share, rows, dtype):
    """This rank's factors as one vector: per layer x (rows x in), then share * delta (rows x out)."""
    parts = [numpy.zeros(0, dtype=dtype)]
    for layer in layers:
        if rows:
            parts += [layer.x.ravel(), (share * layer.delta).ravel()]
    return numpy.concatenate(parts)


def unpack_factors(layers, block):
    """The inverse of ``pack_factors``: [(x, delta)] per layer; the rows follow from the length."""
    width = sum(layer.linear.in_features + layer.linear.out_features for layer in layers)
    rows, start, factors = len(block) // width, 0, []
    for layer in layers:
        fan_in, fan_out = layer.linear.in_features, layer.linear.out_features
        x = block[start:start + rows * fan_in].reshape(rows, fan_in)
        start += rows * fan_in
        delta = block[start:start + rows * fan_out].reshape(rows, fan_out)
        start += rows * fan_out
        factors.append((x, delta))
    return factors


def local_gradient_and_the_rest(comm, objective, batch, rest, allreduce):
    """What both hearts do first: the gradient on this rank's piece, weighted by its share of the
    batch (each factored layer keeps its x and delta), and one dense allreduce of every entry that
    is not a factored weight (``rest``). Returns (this rank's mean loss, its share, its rows)."""
    rows = len(batch.index)
    share = rows / batch.total
    if rows:
        loss = objective.loss_and_grad(batch.index)
        objective.grad *= share
    else:
        loss = 0.0
        objective.grad[...] = 0
    dense = objective.grad[rest]
    allreduce(comm, dense)
    objective.grad[rest] = dense
    return loss, share, rows


def sufficient_factor_step(comm, objective, optimizer, batch, layers, rest, allreduce, largest):
    """One synchronous step (the heart): the factored layers' gradients rebuilt from every rank's
    factors, everything else allreduced. Returns this rank's mean loss on its piece."""
    # BEGIN SOLUTION
    # this rank's gradient, weighted by its share; everything but the factored weights allreduced
    loss, share, rows = local_gradient_and_the_rest(comm, objective, batch, rest, allreduce)
    # every rank's factors to every other rank
    if layers:
        blocks = broadcast_factors(comm, pack_factors(layers, share, rows, objective.grad.dtype), largest)
        per_rank = [unpack_factors(layers, block) for block in blocks]
    # dW = X^T D over every rank's rows, stacked in rank order: the same bits on every rank
    for number, layer in enumerate(layers):
        x = numpy.concatenate([factors[number][0] for factors in per_rank])         # (rows of all, in)
        delta = numpy.concatenate([factors[number][1] for factors in per_rank])     # (rows of all, out)
        layer.linear.weight.grad[...] = x.T @ delta                                 # (in, out)
    # the same update on every rank
    optimizer.step()
    # END SOLUTION
    return loss


def server_factor_step(comm, objective, optimizer, batch, layers, rest, allreduce, largest):
    """One synchronous step with a sharded server (the heart of --exchange server): each factored
    layer's owner (rank layer number mod p) gathers every rank's factors, forms dW = X^T D and
    sends it back; everything else is allreduced. Returns this rank's mean loss on its piece."""
    rank, size = comm.Get_rank(), comm.Get_size()
    # BEGIN SOLUTION
    # this rank's gradient, weighted by its share; everything but the factored weights allreduced
    loss, share, rows = local_gradient_and_the_rest(comm, objective, batch, rest, allreduce)
    for number, layer in enumerate(layers):
        owner = number % size
        mine = pack_factors([layer], share, rows, objective.grad.dtype)
        if rank == owner:
            # the server shard: every rank's factors, in rank order; dW = X^T D; dW back to each rank
            blocks = [mine if source == rank else receive_factors(comm, source, largest, mine.dtype, GATHER)
                      for source in range(size)]
            factors = [unpack_factors([layer], block)[0] for block in blocks]
            x = numpy.concatenate([x for x, _ in factors])                          # (rows of all, in)
            delta = numpy.concatenate([delta for _, delta in factors])              # (rows of all, out)
            layer.linear.weight.grad[...] = x.T @ delta                             # (in, out)
            for destination in range(size):
                if destination != rank:
                    comm.Send(layer.linear.weight.grad, destination, SEND_BACK)
        else:
            # a worker: push the factors, pull the layer's gradient
            comm.Send(mine, owner, GATHER)
            comm.Recv(layer.linear.weight.grad, owner, SEND_BACK)
    # the same update on every rank
    optimizer.step()
    # END SOLUTION
    return loss


def train(comm=None, factors="auto", exchange="broadcast", allreduce="ring", **settings):
    """Sufficient-factor broadcasting SGD on ``comm``; returns (final flat parameters as NumPy, history).

    ``factors``: 'auto' (per layer, by ``factors_pay`` at each epoch's per-rank batch size), 'always',
    'never'. ``exchange``: 'broadcast' (peer to peer) or 'server' (a synchronous sharded server).
    The history's records carry ``factored``, the layers factored in that epoch as (in, out) pairs.
    """
    comm = comm or MPI.COMM_WORLD
    settings = Settings.of(settings, **DEFAULTS)

    def check(_):
        allreduce_function(allreduce)
        if backend.get_backend() != "numpy":
            raise SettingError(f"sufficient_factors runs on host (NumPy) arrays only; the backend is "
                               f"{backend.get_backend()!r}")
        if factors not in CHOICES:
            raise SettingError(f"unknown --factors {factors!r}; choose one of {', '.join(CHOICES)}")
        if exchange not in EXCHANGES:
            raise SettingError(f"unknown --exchange {exchange!r}; choose one of {', '.join(EXCHANGES)}")
    run = Run.start(comm, settings, check=check,
                    writer=checkpoint.Writer("sufficient_factors", checkpoint.SGD_FAMILY))
    size = comm.Get_size()
    net = getattr(run.objective, "net", None)
    # every Linear layer that may ever send factors keeps them; which do is decided per batch size
    candidates = factor_linear_layers(net, lambda _: factors != "never") if net is not None else []
    summed = allreduce_function(allreduce)
    plans, now = {}, {"epoch": run.first_epoch, "plan": None}

    def plan(batch):
        """(the layers that send factors, the flat indices of everything else, the largest factors
        block in elements) at per-rank batch ``batch``: every rank computes the same from ``batch``."""
        if batch not in plans:
            sending = [layer for layer in candidates if factors == "always" or
                       factors_pay(batch, layer.linear.in_features, layer.linear.out_features, size, exchange)]
            width = sum(layer.linear.in_features + layer.linear.out_features for layer in sending)
            plans[batch] = sending, dense_entries(run.objective, sending), batch * width
        return plans[batch]

    def step(piece):
        # this epoch's per-rank batch (--batch-schedule grows it): no rank's piece has more rows
        batch = run.schedule.batch_at(now["epoch"]) if run.schedule else settings.batch_size
        now["plan"] = layers, rest, largest = plan(batch)
        chosen = server_factor_step if exchange == "server" else sufficient_factor_step
        return chosen(run.counting, run.objective, run.optimizer, piece, layers, rest, summed, largest)

    def next_epoch(epoch):
        now["epoch"] = epoch + 1

    def evaluate():
        shapes = [[layer.linear.in_features, layer.linear.out_features] for layer in now["plan"][0]]
        return {**run.objective.evaluate(), "factored": shapes}
    return run.loop(step, evaluate=evaluate, end_of_epoch=next_epoch)


def dense_entries(objective, sending):
    """The flat indices of every parameter but the weights of the ``sending`` layers (allreduced)."""
    factored = {id(layer.linear.weight) for layer in sending}
    dense = numpy.ones(len(objective.grad), dtype=bool)
    for parameter, (start, stop) in zip(objective.flat.parameters, objective.flat.offsets):
        if id(parameter) in factored:
            dense[start:stop] = False
    return numpy.flatnonzero(dense)


def main(argv=None):
    parser = cli.parser(__doc__.splitlines()[0], allreduce="ring", **DEFAULTS)
    parser.add_argument("--factors", default="auto", choices=CHOICES,
                        help="send a Linear layer's factors: auto (where they cost fewer bytes), always, never")
    parser.add_argument("--exchange", default="broadcast", choices=EXCHANGES,
                        help="broadcast: every rank's factors to every rank; server: to the layer's owner rank, "
                             "which sends dW back")
    args = parser.parse_args(argv)
    cli.run_main(train, args, factors=args.factors, exchange=args.exchange, allreduce=args.allreduce)


if __name__ == "__main__":
    main()
