"""Hogwild!'s error contract on the command line: any bad input or failure stops every rank within
seconds with ``error: <what, where>`` and exit status 2, no traceback and no hang.

Each case hung, exited 0, or gave an unhelpful message with the code before the reshaping
(commit 581865d); each run below has 3 ranks (4 where uneven shards are needed) and 60 seconds.
"""
import pytest

from tests.helpers import assert_stopped, launch

SMALL = ["--n-samples", "300", "--features", "50", "--epochs", "1", "--quiet"]


def test_a_nan_loss_on_the_cnn_stops_every_rank_even_when_one_rank_has_more_steps():
    # 1437 rows on 4 ranks, batch 359: rank 0 takes 2 steps an epoch, the others 1. Before, the rank
    # that met the nan raised alone and the others waited in the next collective for ever.
    done = launch("hogwild", "--problem", "dense", "--lr", "1e30", "--epochs", "2", "--batch-size", "359", "--quiet",
                  ranks=4)
    assert_stopped(done, "diverged: epoch 1's mean training loss nan", ranks=4, before_training=False)


def test_a_diverged_sparse_run_is_an_error_not_a_result():
    done = launch("hogwild", "--lr", "1e6", *SMALL)    # before: printed "loss nan" and exited 0
    assert_stopped(done, "diverged: epoch 1's full-data loss", before_training=False)


@pytest.mark.parametrize("flags, message", [
    (["--seed", "-1"], "--seed must be an integer >= 0"),
    (["--nnz", "0"], "--nnz must be an integer >= 1 and <= 50"),
    (["--n-samples", "0"], "--n-samples must be an integer >= 1"),
], ids=["seed", "nnz", "n-samples"])
def test_bad_flags_stop_every_rank_before_training(flags, message):
    # before: the sparse problem was drawn on rank 0 only, which raised while the others waited in
    # the broadcast for ever
    assert_stopped(launch("hogwild", *SMALL, *flags), message)


def test_hogwild_does_not_offer_momentum():
    # before: --momentum was accepted and ignored; Hogwild's update has none, so the flag is not offered
    done = launch("hogwild", *SMALL, "--momentum", "0.9")
    assert done.returncode == 2 and "unrecognized arguments: --momentum" in done.stderr, done.stderr


@pytest.mark.parametrize("flag", ["--log", "--save"])
def test_an_unwritable_output_stops_every_rank_before_training(tmp_path, flag):
    path = tmp_path / "missing" / "out"
    done = launch("hogwild", *SMALL[:-1], flag, str(path))   # before: a hang (--log before training, --save after)
    assert_stopped(done, f"{flag} {path}: ")             # and nothing trained


def test_save_then_resume_continues_and_a_garbage_resume_names_the_file(tmp_path):
    saved = tmp_path / "hogwild.npz"
    first = launch("hogwild", *SMALL, "--save", str(saved))
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = launch("hogwild", *SMALL[:4], "--epochs", "3", "--resume", str(saved))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "epoch 1 " not in resumed.stdout and resumed.stdout.count("epoch 3 ") == 1, resumed.stdout
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint")
    assert_stopped(launch("hogwild", *SMALL, "--resume", str(garbage)), f"--resume {garbage}: ")   # names the file
