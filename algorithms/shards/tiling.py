"""Spatial tiles of a convolutional network: which rows of every feature map each rank owns and reads.

    tiling = Tiling.of(net, height, width, size)      # SettingError for a model or layout it cannot tile
    stage = tiling.stages[s]                         # conv s (stride 1) -> ReLU? -> max pool q x q (q = 1: none)
    Tiling.of(net, height, width, size, layer=LocallyConnected2d)   # DistBelief's locally connected stages
    stage.owned[r], stage.needed[r], stage.out[r]    # (lo, hi) rows of conv s's input and its pooled output

What ``algorithms/spatial_parallel.py`` runs (its header tells the algorithm); this module is only
the geometry. Stage s maps a (C_s, H_s, W_s) map by a k x k convolution with padding p to
O_s = H_s + 2 p - k + 1 rows, then pools q x q windows (stride q) to H_s+1 = O_s // q rows.

Tiles are aligned to the pooling windows: rank r owns the pooled rows out[r] = [c_r, d_r) (a
``minidl.data.shard`` of H_s+1, uneven blocks allowed), so it computes the convolution's rows
[q c_r, q d_r) and pools them without a neighbour's help. Those conv rows read the input rows

    needed[r] = [q c_r - p, q d_r - p + k - 1)  clipped to [0, H_s)   (rows outside: zero padding)

of which it owns owned[r] (stage 0: the image rows [q c_r, q d_r), the last rank to H_0;
stage s > 0: the previous stage's out[r]). The rest is the halo, all of it from the two neighbours:

    top[r]    = [needed_lo, min(owned_lo, needed_hi))   rows rank r - 1 owns
    bottom[r] = [max(owned_hi, needed_lo), needed_hi)   rows rank r + 1 owns

A layout whose halo would reach past a neighbour's tile, or that leaves a rank without a pooled row,
is refused (``SettingError``). The layers after the last convolution (Flatten, Linear, ReLU) are
the head, which every rank runs whole on the gathered map. The stages may instead be locally
connected layers (``layer=LocallyConnected2d``: the same windows, unshared weights; ``stage.conv``
is then that layer): the same geometry, and each rank's rows of their weights are the weights of
the output rows it computes (``conv_rows``).
"""
import dataclasses

from algorithms.core.cli import SettingError
from minidl.conv import im2col_blocked
from minidl.conv.im2col_blocked import image_blocks
from minidl.data import shard_sizes
from minidl.nn import Conv2d, Flatten, Linear, LocallyConnected2d, MaxPool2d, ReLU

HEAD_LAYERS = (Flatten, Linear, ReLU)
KIND = {Conv2d: "convolutional layers", LocallyConnected2d: "locally connected layers"}


def blocks(lo_hi_sizes):
    """Contiguous (lo, hi) ranges of the given sizes, from 0."""
    ranges, start = [], 0
    for size in lo_hi_sizes:
        ranges.append((start, start + int(size)))
        start += int(size)
    return ranges


@dataclasses.dataclass
class Stage:
    conv: Conv2d              # or a LocallyConnected2d
    relu: bool
    pool: int                 # q: pooling window and stride (1: no pooling)
    rows: int                 # H_s, the input map's rows
    width: int                # W_s
    owned: list               # per rank: (lo, hi) input rows it holds
    needed: list              # per rank: (lo, hi) input rows its convolution reads (inside the map)
    out: list                 # per rank: (lo, hi) pooled output rows it computes

    def top(self, rank):
        """(lo, hi) rows rank ``rank`` receives from rank - 1 (empty: lo == hi)."""
        (need_lo, need_hi), (own_lo, _) = self.needed[rank], self.owned[rank]
        return need_lo, max(need_lo, min(own_lo, need_hi))

    def bottom(self, rank):
        """(lo, hi) rows rank ``rank`` receives from rank + 1 (empty: lo == hi)."""
        (need_lo, need_hi), (_, own_hi) = self.needed[rank], self.owned[rank]
        return min(need_hi, max(own_hi, need_lo)), need_hi

    def padding(self, rank):
        """(zero rows above, zero rows below) of rank's window: the conv's padding at the map's edges."""
        k, p, (lo, hi) = self.conv.kernel_size, self.conv.padding, self.out[rank]
        first, last = self.pool * lo - p, self.pool * hi - p + k - 1      # the window, padded coordinates
        return max(0, -first), max(0, last - self.rows)

    def conv_rows(self, rank):
        """(lo, hi): the rows of the stage's output, before pooling, that rank ``rank`` computes."""
        lo, hi = self.out[rank]
        return self.pool * lo, self.pool * hi

    def halo_rows(self):
        """Rows received by all ranks together for one exchange (every row sent once)."""
        return sum(hi - lo for rank in range(len(self.owned)) for lo, hi in (self.top(rank), self.bottom(rank)))


class Tiling:
    """The stages of a network split into spatial tiles over ``size`` ranks, and its head."""

    def __init__(self, stages, head, size):
        self.stages, self.head, self.size = stages, head, size

    @classmethod
    def of(cls, net, height, width, size, name="the model", layer=Conv2d):
        """Tile ``net`` (a Sequential) for (C, height, width) inputs over ``size`` ranks, its stages of ``layer``
        (Conv2d or LocallyConnected2d); SettingError if it cannot."""
        layers, convs = list(net), []
        while layers and type(layers[0]) is layer:
            conv, relu, pool = layers.pop(0), False, 1
            if conv.stride != 1:
                raise SettingError(f"{name}: the spatial split here needs convolutions of stride 1, got {conv.stride}")
            if layers and isinstance(layers[0], ReLU):
                relu = bool(layers.pop(0))
            if layers and isinstance(layers[0], MaxPool2d) and type(layers[0]) is MaxPool2d:
                window = layers.pop(0)
                if window.stride != window.kernel_size or window.padding:
                    raise SettingError(f"{name}: the spatial split aligns tiles to pooling windows: it needs "
                                       f"max pooling with stride = kernel and no padding")
                pool = window.kernel_size
            convs.append((conv, relu, pool))
        if not convs:
            raise SettingError(f"{name}: the spatial split tiles {KIND[layer]}; the network must start "
                               f"with a {layer.__name__} (an MLP has no feature map to tile)")
        other = [type(layer).__name__ for layer in layers if not isinstance(layer, HEAD_LAYERS)]
        if other:
            raise SettingError(f"{name}: after the convolutions the spatial split runs a head of Flatten, "
                               f"Linear and ReLU layers, not {other[0]}")
        stages, owned = [], None
        for s, (conv, relu, pool) in enumerate(convs):
            k, p = conv.kernel_size, conv.padding
            rows_out = (height + 2 * p - k + 1) // pool
            if size > rows_out:
                raise SettingError(f"{size} ranks but conv layer {s}'s output has only {rows_out} rows after "
                                   f"pooling: every rank needs a row of every map (use at most {rows_out} ranks)")
            out = blocks(shard_sizes(rows_out, size))
            if owned is None:                  # the image: the rows of my first convolution's outputs
                owned = [(pool * lo, pool * hi) for lo, hi in out]
                owned[-1] = (owned[-1][0], height)
            needed = [(max(0, pool * lo - p), min(height, pool * hi - p + k - 1)) for lo, hi in out]
            stage = Stage(conv, relu, pool, height, width, owned, needed, out)
            for rank in range(size):
                (top_lo, _), (_, bottom_hi) = stage.top(rank), stage.bottom(rank)
                if (rank > 0 and top_lo < owned[rank - 1][0]) or (rank < size - 1 and bottom_hi > owned[rank + 1][1]):
                    raise SettingError(f"{size} ranks: conv layer {s} on rank {rank} reads rows "
                                       f"{needed[rank][0]}..{needed[rank][1] - 1}, beyond its neighbours' tiles "
                                       f"(the halo is wider than a tile; use fewer ranks)")
            stages.append(stage)
            owned, height, width = out, rows_out, (width + 2 * p - k + 1) // pool
        return cls(stages, layers, size)

    @property
    def final(self):
        """(lo, hi) rows of the last map per rank, and its (channels, rows, width)."""
        last = self.stages[-1]
        return last.out, (last.conv.out_channels, last.out[-1][1],
                          (last.width + 2 * last.conv.padding - last.conv.kernel_size + 1) // last.pool)

    def halo_bytes(self, batch, itemsize):
        """Bytes all ranks send for one step's halos: forward rows and their gradients back (stages s >= 1;
        stage 0 reads its halo from the data every rank holds)."""
        return sum(2 * stage.halo_rows() * batch * stage.conv.in_channels * stage.width * itemsize
                   for stage in self.stages[1:])

    def gather_bytes(self, batch, itemsize):
        """Bytes all ranks send to gather the last map: each tile travels to the P - 1 other ranks."""
        _, (channels, rows, width) = self.final
        return (self.size - 1) * batch * channels * rows * width * itemsize

    def activation_bytes(self, rank, batch, itemsize, recompute=False):
        """Bytes rank ``rank``'s conv stages keep for the backward (``spatial_parallel.run_stage``): per stage
        its zero-padded window, the conv output, the GEMM's result and the columns (minidl.conv's workspace
        pool keeps both; a batch too large for one block of its blocked im2col pools one block's), the
        ReLU's output, and the pooling's k k window copy and output. ``recompute``: every stage's output
        tile and pooled workspaces, and one stage's (the largest) activations, recorded again."""
        kept, tiles, pooled = [], 0, 0
        for stage in self.stages:
            conv, (lo, hi), (top, bottom) = stage.conv, stage.out[rank], stage.padding(rank)
            k, p, (need_lo, need_hi) = conv.kernel_size, conv.padding, stage.needed[rank]
            rows, width = stage.pool * (hi - lo), stage.width + 2 * p - k + 1       # conv output rows, columns
            out, columns = conv.out_channels * rows * width, conv.in_channels * k * k * rows * width
            window = conv.in_channels * (need_hi - need_lo + top + bottom) * (stage.width + 2 * p)
            kept.append(window + out + (out if stage.relu else 0))
            kept[-1] += out // stage.pool ** 2 * (stage.pool ** 2 + 1) if stage.pool > 1 else 0
            tiles += out // stage.pool ** 2
            image = (conv.in_channels, need_hi - need_lo + top + bottom, stage.width + 2 * p)
            block = image_blocks((im2col_blocked.BLOCK_BYTES // (columns * itemsize) + 2,) + image, conv.weight.shape,
                                 1, 0, itemsize)[0][1]
            blocks = batch if batch <= block else block + batch % block       # one block's and the last's
            if im2col_blocked.kept_layout((batch,) + image, conv.weight.shape, 1, 0, itemsize, -(-batch // block)):
                # the batch's columns kept, built a block at a time: each block's window (batch innermost)
                # and GEMM result pooled (minidl.conv.batch_inner)
                pooled += batch * columns + blocks * (out + window)
            else:
                # one block: the columns and the GEMM's result pooled; blocks (minidl.conv.im2col_blocked):
                # one block's and the last's pooled
                pooled += blocks * (columns + out)
        return (pooled + batch * (tiles + max(kept) if recompute else sum(kept))) * itemsize

    def conv_parameters(self):
        return sum(parameter.size for stage in self.stages for parameter in stage.conv.parameters())
