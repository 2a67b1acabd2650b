"""Memory accounts: the bytes each rank holds, by method, predicted by formula and measured on a real step.

    python -m algorithms.memory --ranks 4 --model lenet5 [--batch-size 64] [--micro-batches 4] [--json out.json]
    python -m algorithms.memory --ranks 4 --model wide-mlp --optimizer adam     # the paper's Figure 1 case
    mpiexec -n 4 python -m algorithms.memory --ranks 4 --model lenet5      # measures the collectives' buffers too

Papers: Rajbhandari et al. 2020 (ZeRO), section 5 and Figure 1: model states of Psi parameters per
device, K bytes of optimizer state per parameter, N_d data-parallel ranks: baseline (2 + 2 + K) Psi
in mixed precision, stage 1 (P_os) 4 Psi + K Psi / N_d, stage 2 (P_os+g) 2 Psi + (2 + K) Psi / N_d,
stage 3 (P_os+g+p) (2 + 2 + K) Psi / N_d. Written here for float32 (b = 4 bytes a value, no fp16
copies) and momentum SGD (one state value per parameter, k = 1; k = 0 without momentum) or, with
``--optimizer adam``, Adam (k = 2; data parallelism and ZeRO only).
Chen et al. 2016 for recomputation; Huang et al. 2019 (GPipe) and Narayanan et al. 2021
(PipeDream-Flush's 1F1B) for the activations in flight; Shoeybi et al. 2019 (Megatron-LM) for the
tensor split; Dean et al. 2012 for the spatial split. Full references: tutorials/references.md.

Per rank, for n parameters, p ranks, b = 4 bytes a value, k state values per parameter (momentum
SGD 1, Adam 2: the paper's K = 4 k bytes), a batch of B rows per replica (``--batch-size``) and
A(layers, rows) the activations the forward keeps (``algorithms.memory.footprint``, which counts
minidl's own kernels; the formulas are ``algorithms.memory.accounts``). The first four columns are
the papers' parts, predicted from each method's definition; "extra" is what this implementation
adds, each term measured too:

    method         params           grads                 optimizer  activations              extra
    data parallel  n b              n b                   k n b      A(all, B)                n/p b + a n b     (1)
    ZeRO-1         n b              n b                   k n_r b    A(all, B)                sum_s s b + a c b (2)
    ZeRO-2         n b              max_u (n_u + n_>u) b  k n_r b    A(all, B)                as ZeRO-1
    ZeRO-3         (n_r + n_max) b  max_u (n_u + n_>u) b  k n_r b    A(all, B)                as ZeRO-1
    tensor         n_c + n_f/p      as params             k params   A(convs, B) + A(fc, B)/p (B o + B i)/p b + 2 n b
    GPipe          n_s b            n_s b                 k n_s b    m A(stage, B/m)          (m + 1) B/m out_s b + R
    1F1B           n_s b            n_s b                 k n_s b    min(p, m) A(stage, B/m)  as GPipe
    spatial        n b              n b                   k n b      A_tiles(r, B) + A(fc, B) B C H W b + n_c/p b (5)
    spatial local  n_r b            n_r b                 k n_r b    A_local(r, B)            B classes / p b   (6)
    hybrid         2-stage 1F1B with p/2 replicas of each stage, plus n_s/(p/2) b of the column's ring

(1) the ring's receive block, and the a vectors of n that minidl's update makes and drops (a = 1
for momentum SGD's lr * grad, 5 for Adam's; measured). (2) ZeRO's units (``algorithms.shards.units``:
each layer with parameters; with --recompute each checkpointed segment) hold n_u values; rank 0 keeps
the largest block of each, n_r = sum_u ceil(n_u / p) in all, c the largest block; n_max the largest
unit; n_>u the blocks of the units after u, already reduced when u's whole gradient is alive. Stage 3
holds one unit's weights whole from its gather to its release; stages 2 and 3 one unit's whole
gradient from its backward to its reduce-scatter; stage 1 every unit's until the update. The ring
caches one receive block per block size s; the update makes its a arrays one block at a time.
(3) tensor's extra: the receive blocks of g's allreduce of the (B, o) row-parallel output and of f's of the (B, i)
gradient of the block's input (none where that input is the data), and the serial model's flat
weights and gradient, which ``tensor_parallel`` keeps for evaluation and checkpoints. (4) GPipe's: every
micro-batch's output, which ``pipeline_gradient``'s Isend holds until the step's Waitall, one
gradient received, and R = (2 + k)(n - n_s) b, the rest of the whole model's weights, gradient and
momentum, which every ``pipeline_parallel`` rank keeps and steps (evaluation and checkpoints read
them). (5) the gathered last map (C, H, W) and the ring's block of the conv weights' gradient.
(6) ``spatial_parallel --layer local`` on the small CNN's locally connected twin (--model cnn):
rank r owns the weights of its rows of every stage and of the head's first Linear, n_r values,
n/p up to the tiles' uneven rows (``accounts.local_region``, which also counts A_local: its tiles'
windows, columns, outputs and pooling); no weight moves, only the ring's block of the logits' sum.

Data parallelism and ZeRO also report their step's peak (tracemalloc's, over a real step) and the
bytes rank 0 sends per step (predicted: a ring reduce-scatter sends every block but its own, an
allgather every block but the next rank's; measured by the tracer): stages 1 and 2 send what an
allreduce sends, stage 3 one allgather more, 1.5 times (``algorithms.memory.sharded``). The parts are
each the most they hold during the step and do not all peak together: the activations are gone when
the optimizer's arrays come, while the backward's own gradients of the activations, which no part
counts, come on top of the activations (the MLP at 512 rows peaks above the parts' sum).

Terms the measurements showed missing from the first formulas, now in them: an earlier ZeRO that
gathered the whole model as one unit kept the whole gradient (stage 2) and the whole weights (stage
3) through every step, so that its stage 3 held more than data parallelism; unit by unit it holds one
layer. The tensor row counted the row-parallel layer's output once: the block keeps three (B, o)
arrays (its partial product, g's sum, the sum plus the bias), and its comm buffers are the ring's
blocks, not a whole (B, o) output. The loss keeps, beside its shifted logits, its log-sum and the
int64 labels and row indices (20 bytes a row: ``footprint.LOSS_EXTRA``), which the pipeline's many
small micro-batches made visible. The update's arrays (Adam's five) were in no column.

n/p means the largest shard, ceil(n/p). tensor: the Linear layers in pairs (column-parallel, then
row-parallel: Megatron's MLP block), each pair's weights and the column layer's activations split
p ways (the row layer's bias whole), an unpaired last Linear whole; n_c the other layers'
parameters. Pipeline: stage s holds n_s parameters of its contiguous layers (``pipeline_parallel``'s
cut), m micro-batches, out_s its output bytes per row (the sends of all m micro-batches stay alive
until the step's Waitall in ``pipeline_gradient``, and one gradient is received at a time); the
table shows stage 0, which holds the most micro-batches in flight (GPipe all m, 1F1B at most p).
Spatial: A_tiles the bytes rank r's tiles keep, halo and padding included (``Tiling.activation_bytes``),
for the rank with the most. With ``--recompute`` (the table's second half) data parallelism and ZeRO
keep only about sqrt(L) segment outputs and recompute the largest segment in the backward
(``footprint.activations``); the pipeline and the hybrid run each stage as one segment: a
micro-batch in flight keeps its stage's output, and a backward runs one micro-batch's stage again,
max(k out, (k - 1) out + A(stage)) for k in flight (``accounts.pipeline``). tensor_parallel
recomputes each split block (its column output and ReLU not kept; the backward records the
largest block's again, with its (B, o) row product: one block alone costs B o b more than without),
spatial_parallel each conv stage (its output tile kept; the backward records the largest stage's
tile activations again, ``Tiling.activation_bytes``).

Measured: every row that applies, one step of the real algorithm (data parallelism, ZeRO:
``algorithms.memory.sharded``) or of its pieces phase by phase (``algorithms.memory.measured``:
tensor_parallel's split network, stage 0 of pipeline_parallel's schedule with its own layers and
state, the hybrid's stage and column ring, spatial_parallel's tiles) under tracemalloc. Under
``mpiexec -n P`` the collectives run for real and their buffers are measured; in one process (P
other than p) the layout is rank 0's: data parallelism and ZeRO run with a stand-in for the peers
(their buffers measured, their values zeros), and the other rows' extra, which needs peers, prints
"-" (the pipeline's sends are its own); spatial needs its p ranks. Each measured part holds a few
hundred bytes of Python objects per layer and graph node that no formula counts (up to 4 KiB per
row, 2 KiB more per ZeRO unit; about 2 KiB per micro-batch in flight): hence the MLP's table at 512
rows in 4 micro-batches.

What the numbers say for LeNet-5: the conv workspaces (im2col columns) are most of its activations,
and minidl's workspace pool keeps them whatever runs, so sqrt(L) recomputation saves little there;
a pipeline stage recomputed whole keeps one micro-batch's workspaces instead of m. 1F1B holds
min(p, m) micro-batches where GPipe holds m. tests/test_memory.py: every row's total within 10% of
its prediction and every part within 10% (or 4 KiB) for LeNet-5 (batch 64) and the MLP (batch 512),
at p = 1, 2 (mpiexec) and 4 (in process); tests/test_memory_zero.py: on the wide MLP with Adam the
measured peaks fall from data parallelism to stage 1, 2 and 3 at p = 2, 4 and 8, and stage 3's model
states are within 10% of (4 + 4 + K) n / p plus the largest unit's weights and gradient.

The package, a module each:

    accounts.py     the formulas above, one per method (``predicted_rows``)
    footprint.py    what minidl's own kernels keep: a forward's activations and workspaces, by layer
    allocations.py  a forward's activations (and allreduce SGD's step) measured phase by phase under tracemalloc
    sharded.py      data parallelism's and ZeRO's real steps measured: their parts, peak and bytes sent
    measured.py     the other methods' steps measured phase by phase: tensor, pipeline, hybrid, spatial
    table.py        the table: each method's predicted and measured row; the command's flags
"""
