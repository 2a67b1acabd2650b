"""Pipeline recomputation (pipeline_parallel and hybrid_parallel --recompute): each stage one checkpointed
segment, the same bits as without, and stage 0's activations in flight lower by what the stage predicts;
and ZeRO's --recompute (sqrt(L) segments, as allreduce SGD's), the same bits too.

Run: python tests/run.py --max-ranks 4 -- tests/test_pipeline_recompute.py

Hand count for the MLP (Flatten, Linear 64 -> 128, ReLU | Linear 128 -> 64, ReLU, Linear 64 -> 10) cut
into 2 stages: stage 0 keeps per row the Linear's and the ReLU's outputs, 2 x 128 float32 = 1024 bytes,
and sends 128 values, 512 bytes. A global batch of 512 rows in m = 4 micro-batches of r = 128 rows:

    plain        GPipe holds 4 micro-batches, 1F1B at most P = 2:           4 r 1024     2 r 1024
    recomputed   each keeps only its output (its input is the data), and a backward runs one
                 micro-batch's stage again while its own output is held by its send alone:
                 max(k r 512, (k - 1) r 512 + r 1024) for k micro-batches in flight
    saved        GPipe 512 KiB - 320 KiB = 192 KiB;   1F1B 256 KiB - 192 KiB = 64 KiB

Measured by ``algorithms.memory.measured.pipeline`` (stage 0's schedule run in this process under
tracemalloc); the saving must be within 10% of the hand count.
"""
import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import hybrid_parallel, pipeline_parallel, zero
from algorithms.core import cli
from algorithms.memory import measured
from minidl.recompute import Checkpoint
from tests.helpers import expect_error_on_every_rank, small_data

KIB = 1024
SAVED = {"gpipe": 192 * KIB, "1f1b": 64 * KIB}


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_stage_0s_activations_in_flight_drop_by_what_the_stage_predicts(kind):
    plain, recomputed = (measured.pipeline("mlp", 2, 512, 4, kind, recompute)["activations"]
                         for recompute in (False, True))
    saved = plain - recomputed
    assert abs(saved - SAVED[kind]) <= 0.1 * SAVED[kind], \
        f"{kind}: saved {saved / KIB:.1f} KiB (plain {plain / KIB:.1f}), predicted {SAVED[kind] / KIB:.0f} KiB"


def test_the_flag_reaches_the_stage_as_one_checkpointed_segment():
    args = cli.parser("pipeline", recompute=True).parse_args(["--recompute"])
    assert cli.shared_settings(args)["recompute"] is True
    net = pipeline_parallel.build_model("mlp", 0, "digits")
    stage = pipeline_parallel.Stage(net, 0, 2, np.zeros((1, 1, 8, 8), dtype=np.float32), recompute=True)
    assert isinstance(stage.layers, Checkpoint) and len(stage.layers.module) == 3 and len(net) == 6


@pytest.mark.parallel(nprocs=[2])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_pipeline_with_recompute_trains_bit_for_bit_as_without(kind):
    runs = [pipeline_parallel.train(MPI.COMM_WORLD, schedule=kind, micro_batches=4, model="mlp", data=small_data(),
                                    epochs=1, quiet=True, recompute=flag)[0] for flag in (False, True)]
    parallel_assert(np.array_equal(*runs), f"--recompute changed {kind}'s parameters")


@pytest.mark.parallel(nprocs=[4])
def test_hybrid_with_recompute_trains_bit_for_bit_as_without():
    runs = [hybrid_parallel.train(MPI.COMM_WORLD, stages=2, model="mlp", data=small_data(), epochs=1, quiet=True,
                                  recompute=flag)[0] for flag in (False, True)]
    parallel_assert(np.array_equal(*runs), "--recompute changed the hybrid's parameters")


@pytest.mark.parallel(nprocs=[4])
def test_hybrid_refuses_recompute_for_a_model_parallel_replica_on_every_rank():
    expect_error_on_every_rank(lambda: hybrid_parallel.train(MPI.COMM_WORLD, stages=2, group="model", model="mlp",
                                                             data=small_data(), epochs=1, quiet=True, recompute=True),
                               "--recompute sets how a pipeline replica runs")


@pytest.mark.parallel(nprocs=[2])
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_with_recompute_trains_bit_for_bit_as_without(stage):
    runs = [zero.train(MPI.COMM_WORLD, stage=stage, model="mlp", data=small_data(), epochs=1, quiet=True,
                       recompute=flag)[0] for flag in (False, True)]
    parallel_assert(np.array_equal(*runs), f"--recompute changed ZeRO-{stage}'s parameters")
