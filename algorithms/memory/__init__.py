"""Memory accounts: the bytes each rank holds, by method, predicted by formula and measured on a real step.

    python -m algorithms.memory --ranks 4 --model lenet5 [--batch-size 64] [--micro-batches 4] [--json out.json]
    mpiexec -n 4 python -m algorithms.memory --ranks 4 --model lenet5      # measures the collectives' buffers too

Papers: Rajbhandari et al. 2020 (ZeRO), section 5 and Figure 1: model states of Psi parameters per
device, K bytes of optimizer state per parameter, N_d data-parallel ranks: baseline (2 + 2 + K) Psi
in mixed precision, stage 1 (P_os) 4 Psi + K Psi / N_d, stage 2 (P_os+g) 2 Psi + (2 + K) Psi / N_d,
stage 3 (P_os+g+p) (2 + 2 + K) Psi / N_d. Written here for float32 (b = 4 bytes a value, no fp16
copies) and SGD with momentum (one state value per parameter, k = 1; k = 0 without momentum).
Chen et al. 2016 for recomputation; Huang et al. 2019 (GPipe) and Narayanan et al. 2021
(PipeDream-Flush's 1F1B) for the activations in flight; Shoeybi et al. 2019 (Megatron-LM) for the
tensor split; Dean et al. 2012 for the spatial split. Full references: tutorials/references.md.

Per rank, for n parameters, p ranks, a batch of B rows per replica (``--batch-size``) and A(layers, rows)
the activations the forward keeps (``algorithms.memory.footprint``, which counts minidl's own kernels;
the formulas are ``algorithms.memory.accounts``):

    method         params       grads       optimizer   activations               comm buffers
    data parallel  n b          n b         k n b       A(all, B)                 n/p b                  (1)
    ZeRO-1         n b          n b         k n b / p   A(all, B)                 n/p b                  (1)
    ZeRO-2         n b          n b / p     k n b / p   A(all, B)                 n b + n/p b            (2)
    ZeRO-3         n b / p      n b / p     k n b / p   A(all, B)                 2 n b + n/p b          (3)
    tensor         n_c + n_f/p  as params   k params    A(convs, B) + A(fc, B)/p  (B o + B i)/p b        (4)
    GPipe          n_s b        n_s b       k n_s b     m A(stage, B/m)           (m + 1) B/m out_s b
    1F1B           n_s b        n_s b       k n_s b     min(p, m) A(stage, B/m)   (m + 1) B/m out_s b
    spatial        n b          n b         k n b       A_tiles(r, B) + A(fc, B)  B C H W b + n_c/p b    (5)
    hybrid         2-stage 1F1B with p/2 replicas of each stage, plus n_s/(p/2) b of the column's ring

(1) the ring's receive block (ZeRO-1's allreduce is the ring's); (2) the whole gradient the backward
fills before it is reduce-scattered, and the reduce-scatter's receive block; (3) as (2), and the
whole parameter vector the allgather fills: ``algorithms.zero`` gathers the model as one unit;
(4) the receive blocks of g's allreduce of the (B, o) row-parallel output and of f's of the (B, i)
gradient of the block's input (none where that input is the data); (5) the gathered last map (C, H,
W) and the ring's block of the conv weights' gradient.

Terms the measurements showed missing from the first formulas, now in them: ZeRO-2 and ZeRO-3's
comm had only the paper's per-layer gathering buffers (2 x the largest layer); zero.py keeps the
whole gradient and, in stage 3, the whole w as its reducing and gathering units, and the
reduce-scatter receives into the ring's cached block (at p = 2 the old ZeRO-3 comm was 65.0 KiB where about
173 KiB were measured for the MLP). The tensor row counted the row-parallel layer's output once:
the block keeps three (B, o) arrays (its partial product, g's sum, the sum plus the bias), and its
comm buffers are the ring's blocks, not a whole (B, o) output. The loss keeps, beside its shifted
logits, its log-sum and the int64 labels and row indices (20 bytes a row: ``footprint.LOSS_EXTRA``),
which the pipeline's many small micro-batches made visible.

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

Measured: every row that applies, one step of the real algorithm's pieces phase by phase under
tracemalloc: data parallel by ``algorithms.memory.allocations``, the others by
``algorithms.memory.measured`` (ZeRO's Shard and collectives, tensor_parallel's split network, stage 0
of pipeline_parallel's schedule with its own layers and state, the hybrid's stage and column ring,
spatial_parallel's tiles). Under ``mpiexec -n P`` the collectives run for real and their buffers
are measured; in one process (P other than p) the layout is rank 0's and the comm buffers that need
peers print "-" (the pipeline's sends are its own); spatial needs its p ranks. Pipeline, tensor
and hybrid modules also keep the whole serial model on every rank for evaluation and layout-free
checkpoints: no part of the method's step, counted in neither column. Each measured part holds a
few hundred bytes of Python objects per layer and graph node that no formula counts (up to 4 KiB
per row; about 2 KiB per micro-batch in flight): hence the MLP's table at 512 rows in 4 micro-batches.

What the numbers say for LeNet-5: the conv workspaces (im2col columns) are most of its activations,
and minidl's workspace pool keeps them whatever runs, so sqrt(L) recomputation saves little there;
a pipeline stage recomputed whole keeps one micro-batch's workspaces instead of m. 1F1B holds
min(p, m) micro-batches where GPipe holds m. tests/test_memory.py: every row's total within 10% of
its prediction and every part within 10% (or 4 KiB) for LeNet-5 (batch 64) and the MLP (batch 512),
at p = 1, 2 (mpiexec) and 4 (in process).

The package, a module each:

    accounts.py     the formulas above, one per method (``predicted_rows``)
    footprint.py    what minidl's own kernels keep: a forward's activations and workspaces, by layer
    allocations.py  data parallelism's step measured phase by phase under tracemalloc
    measured.py     the other methods' steps measured so: ZeRO, tensor, pipeline, hybrid, spatial
    table.py        the table: each method's predicted and measured row; the command's flags
"""
