"""Memory accounts (algorithms.memory): the formulas against hand counts, and against tracemalloc on a real step.

Run: python tests/run.py --max-ranks 2 -- tests/test_memory.py

Hand counts for the MLP 64 -> 128 -> 64 -> 10 (float32, 4 bytes a value): n = 64*128 + 128 + 128*64 + 64
+ 64*10 + 10 = 17226 parameters; per example its forward keeps the two hidden layers' outputs and
their ReLUs' (128 + 128 + 64 + 64 values), the logits and the loss's shifted logits (10 + 10):
1616 bytes. The measured bytes include a few hundred bytes of Python objects per layer and graph
node that no formula counts: for the MLP at 512 rows (64 per pipeline micro-batch) and LeNet-5 at 64
that stays below the 10% the accounts are held to.
"""
import json
import math
import subprocess
import sys

import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from algorithms import memory
from algorithms.core import accounts, allocations
from tests.helpers import ENV, ROOT, assert_stopped

MLP_PARAMETERS, MLP_ACTIVATIONS_PER_EXAMPLE, BATCH = 17226, 1616, 64


def rows(records, recompute=False):
    return {record["method"]: record for record in records if record["recompute"] == recompute}


def test_the_mlp_formulas_equal_the_hand_counts_and_the_zero_stages_shard_what_the_paper_says():
    records = rows(memory.table("mlp", 4, BATCH, micro_batches=8, measure=False))
    n, shard = MLP_PARAMETERS * 4, math.ceil(MLP_PARAMETERS / 4) * 4
    dp = records["data parallel"]["predicted"]
    assert (dp["params"], dp["grads"], dp["optimizer"]) == (n, n, n)
    assert dp["activations"] == BATCH * MLP_ACTIVATIONS_PER_EXAMPLE
    assert dp["comm"] == shard                                          # the ring's receive block
    zero = [records[f"ZeRO-{stage}"]["predicted"] for stage in (1, 2, 3)]
    assert [(z["params"], z["grads"], z["optimizer"]) for z in zero] == [(n, n, shard), (n, shard, shard),
                                                                          (shard, shard, shard)]
    gpipe, one_f_one_b = records["pipeline GPipe"]["predicted"], records["pipeline 1F1B"]["predicted"]
    assert gpipe["activations"] == 2 * one_f_one_b["activations"]       # 8 micro-batches in flight against p = 4
    assert "feature map" in records["spatial"]["note"]                  # an MLP has nothing to tile


def disagreements(records, measured_methods):
    """Every part of every measured row whose measured bytes are more than 10% off the prediction (the
    pipeline's state is not measured: None)."""
    measured = [record for record in records if record["measured"] is not None]
    assert {(record["method"], record["recompute"]) for record in measured} == measured_methods
    return [f"{record['method']}, recompute {record['recompute']}, {part}: measured {record['measured'][part]}, "
            f"predicted {predicted}" for record in measured for part, predicted in record["predicted"].items()
            if record["measured"][part] is not None and abs(record["measured"][part] - predicted) > 0.1 * predicted]


# the MLP's arrays are small: at 512 rows (64 per micro-batch) the graph's Python objects stay below 10% of them
MEASURED_BATCH = {"mlp": 512, "lenet5": 64}
ROWS = {("data parallel", False), ("data parallel", True), ("pipeline GPipe", False), ("pipeline 1F1B", False)}
MEASURED = {"mlp": ROWS, "lenet5": ROWS | {("spatial", False)}}


@pytest.mark.parametrize("model", ["mlp", "lenet5"])
def test_predicted_and_measured_agree_within_ten_percent_for_every_measured_row(model):
    assert not disagreements(memory.table(model, 1, MEASURED_BATCH[model], comm=MPI.COMM_SELF), MEASURED[model])


def test_a_batch_beyond_one_block_of_the_blocked_im2col_is_counted_as_it_runs():
    """LeNet-5's first conv has 25 * 28 * 28 * 4 bytes of columns an image: 80 images fill the 6 MiB
    block, so 200 rows run in blocks of 80, 80, 40, keeping no columns."""
    predicted = dict(accounts.predicted_rows("lenet5", 1, 200, 8, 1, False))["data parallel"]
    measured = allocations.data_parallel(MPI.COMM_SELF, "lenet5", (1, 28, 28), 200)
    assert abs(measured["activations"] - predicted["activations"]) <= 0.1 * predicted["activations"], \
        (measured["activations"], predicted["activations"])


@pytest.mark.parallel(nprocs=[2])
@pytest.mark.parametrize("model", ["mlp", "lenet5"])
def test_on_two_ranks_too_and_the_allreduces_buffer_is_the_rings_receive_block(model):
    records = memory.table(model, 2, MEASURED_BATCH[model], comm=MPI.COMM_WORLD)
    off = disagreements(records, MEASURED[model])
    parallel_assert(not off, f"{model} at p = 2: {off}")
    if model == "mlp":
        record, block = rows(records)["data parallel"], math.ceil(MLP_PARAMETERS / 2) * 4
        parallel_assert(record["predicted"]["comm"] == block and record["measured"]["comm"] > 0,
                        f"comm: predicted {record['predicted']['comm']}, ring block {block}")


def test_the_command_prints_every_method_writes_json_and_refuses_a_bad_flag(tmp_path, capsys):
    out = tmp_path / "memory.json"
    memory.main(["--model", "mlp", "--ranks", "4", "--json", str(out)])
    printed = capsys.readouterr().out
    for method in ("data parallel", "ZeRO-3", "tensor", "pipeline GPipe", "pipeline 1F1B", "spatial", "hybrid 2 x p/2"):
        assert method in printed
    assert "not measured" in printed
    written = json.loads(out.read_text())["rows"]
    assert {record["method"] for record in written if record["measured"] is not None} == \
        {"data parallel", "pipeline GPipe", "pipeline 1F1B"}        # spatial: only on 4 ranks
    done = subprocess.run([sys.executable, "-m", "algorithms.memory", "--model", "mlp", "--ranks", "0"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=60)
    assert_stopped(done, "--ranks must be an integer >= 1", ranks=1)
