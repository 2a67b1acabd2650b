"""Hybrid parallelism: R data-parallel replicas x P pipeline stages (or model pieces) equals serial SGD at batch R b.

Run: python tests/run.py --max-ranks 4 -- tests/test_hybrid_parallel.py

Same float64 six-layer MLP and digits as tests/test_pipeline_parallel.py. The replicas' gradients
are summed with MPI's own Allreduce (``allreduce="mpi"``), so only task 6.3's code and the
replicas' (6.1, 6.2) run; the collectives' allreduces are tested with their own tasks.
"""
import pytest
from mpi4py import MPI

from algorithms import hybrid_parallel
from algorithms.core.cli import SettingError
from tests.helpers import EQUAL_UP_TO_ROUNDING, parallel_assert_close, serial_reference, six_layer_mlp, tiny_digits


@pytest.mark.task("6.3")
@pytest.mark.parallel(nprocs=[4])
def test_two_replicas_of_a_two_rank_model_equal_serial_sgd_at_twice_the_batch():
    # 49 rows at 2 x 4 per step: the last global batch has 1 row, so replica 1 has none there
    comm, data = MPI.COMM_WORLD, tiny_digits(n_train=49)
    serial = serial_reference(data, epochs=1, lr=0.1, momentum=0.9, batch_size=2 * 4, model=six_layer_mlp)
    for group, variant in (("pipeline", "gpipe"), ("pipeline", "1f1b"), ("model", "output"), ("model", "input")):
        how = dict(schedule=variant, micro_batches=3) if group == "pipeline" else dict(split=variant)
        params, _ = hybrid_parallel.train(comm, stages=2, group=group, **how, allreduce="mpi", model=six_layer_mlp,
                                          data=data,
                                          epochs=1, lr=0.1, momentum=0.9, batch_size=4, quiet=True)
        parallel_assert_close(params, serial, EQUAL_UP_TO_ROUNDING, f"data 2 x {group} 2 ({variant})")
    with pytest.raises(SettingError, match="4 ranks do not form a grid of --stages 3"):
        hybrid_parallel.train(comm, stages=3, model=six_layer_mlp, data=data, quiet=True)
