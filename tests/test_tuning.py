"""The tuning file: where it lives, what it sets, and that another machine's or a broken one never slips in.

``python -m minidl.tune`` writes one file that minidl (``minidl/tuning.py``) and collectives
(``collectives/model/tuned.py``) each read their own section of at import. Every other test runs
with MINIDL_TUNING=none (tests/conftest.py); these name their own files, and a process that should
read one is started with it in its environment.
"""
import json
import re
import subprocess
import sys

import numpy
import pytest

from collectives.model import tuned
from minidl import tuning
from minidl.conv import auto, budget, im2col_blocked as blocked
from minidl.tune import conv as tune_conv
from tests import helpers
from tests.helpers import ROOT, assert_stopped, launch, mpiexec

CONV2 = ((64, 6, 14, 14), (16, 6, 5, 5), 1, 0)           # LeNet-5's second layer at batch 64
SETTINGS = {"block_bytes": 256 << 10, "column_bytes": 5 << 20, "winograd_min_channels": 32, "fft_min_kernel": 9,
            "layouts": {tuning.shape_key(*CONV2, 4): [[16, "blocks"], [64, "im2col order"]]}}


def tuning_file(folder, machine=None, settings=None, name="tuning.json"):
    """A tuning file whose minidl section says ``settings`` (SETTINGS) measured on ``machine`` (this one)."""
    path = folder / name
    tuning.write_section(path, "minidl", {"machine": machine or tuning.machine(), "settings": settings or SETTINGS})
    return path


def read_in_a_process(path, code, extra=None):
    """Run ``code`` in a fresh Python that reads ``path`` as its tuning file; (stdout's last line as JSON, stderr)."""
    env = dict(helpers.ENV, MINIDL_TUNING=str(path), **(extra or {}))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


SETTINGS_IN_FORCE = ("import json; from minidl.conv import auto, budget, im2col_blocked as b; "
                     "print(json.dumps([b.BLOCK_BYTES, budget.current(), b.LAYOUTS, auto.WINOGRAD_MIN_CHANNELS, "
                     "auto.FFT_MIN_KERNEL]))")


def test_both_packages_find_the_file_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIDL_TUNING", str(tmp_path / "mine.json"))
    assert tuning.path() == tuned.location() == tmp_path / "mine.json"
    monkeypatch.setenv("MINIDL_TUNING", "none")
    assert tuning.path() is None and tuned.location() is None
    monkeypatch.delenv("MINIDL_TUNING")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert tuning.path() == tuned.location() == tmp_path / "config" / "minidl" / "tuning.json"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert tuning.path() == tuned.location() == tmp_path / "home" / ".config" / "minidl" / "tuning.json"


def test_a_file_measured_here_sets_the_kernels_settings_at_import(tmp_path):
    path = tuning_file(tmp_path)
    seen, _ = read_in_a_process(path, SETTINGS_IN_FORCE)
    assert seen == [256 << 10, 5 << 20, SETTINGS["layouts"], 32, 9]
    # MINIDL_CONV_COLUMN_BYTES still wins over the file's budget
    seen, _ = read_in_a_process(path, SETTINGS_IN_FORCE, {"MINIDL_CONV_COLUMN_BYTES": "1000"})
    assert seen[:2] == [256 << 10, 1000]


def test_the_fingerprint_that_keys_pinned_bits_names_the_tuned_settings_in_force(tmp_path):
    """tests/machine.py's fingerprint reads the settings a process runs on, not the shipped ones: under a
    tuning file its blocks, budget, layouts and thresholds, so that no digest pinned on the shipped
    defaults is compared with a tuned run's bits."""
    code = "import json; from tests import machine; print(json.dumps(machine.fingerprint()))"
    seen, _ = read_in_a_process(tuning_file(tmp_path), code)
    assert ", blocks 0.25 MiB, columns 5 MiB, " in seen and seen.endswith(
        ", tuned layouts of 1 shapes, winograd from 32 channels, fft from 9"), seen
    seen, _ = read_in_a_process("none", code)
    assert ", blocks 0.25" not in seen and "tuned" not in seen and "columns 64 MiB" in seen, seen


def test_a_tuning_file_named_but_missing_is_said_and_the_shipped_defaults_run(tmp_path):
    """MINIDL_TUNING naming no file (a typo, a file removed) is said once by each package, not passed over
    in silence; a machine that never tuned (nothing at the default place) says nothing."""
    missing = tmp_path / "tunning.json"
    code = SETTINGS_IN_FORCE.replace("import json;", "import json; import collectives;")
    seen, stderr = read_in_a_process(missing, code)
    assert seen == [tuning.SHIPPED.block_bytes, tuning.SHIPPED.column_bytes, {}, 256, 7]
    assert stderr.count(f"MINIDL_TUNING names {missing}: no such file") == 2 and stderr.count("\n") == 2, stderr
    env = {key: value for key, value in helpers.ENV.items() if key != "MINIDL_TUNING"}
    done = subprocess.run([sys.executable, "-c", code], env=dict(env, XDG_CONFIG_HOME=str(tmp_path)), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_another_machines_file_is_refused_with_a_note_and_the_shipped_defaults_run(tmp_path):
    for key, value in (("numpy", "0.0.1"), ("blas_core", "Prescott"), ("l2_bytes", 1), ("cores", 999)):
        path = tuning_file(tmp_path, machine=dict(tuning.machine(), **{key: value}), name=f"{key}.json")
        seen, stderr = read_in_a_process(path, SETTINGS_IN_FORCE)
        assert seen == [tuning.SHIPPED.block_bytes, tuning.SHIPPED.column_bytes, {}, 256, 7], key
        assert "refused the tuning in" in stderr and f"{key} " in stderr and stderr.count("\n") == 1, stderr
        settings, note = tuning.load(path)
        assert settings == tuning.replace(tuning.SHIPPED, source=settings.source) and key in note


@pytest.mark.parametrize("content, says", [
    ("{oops", "not readable JSON"),
    (json.dumps({"format": "something else", "version": 1}), "not a minidl tuning file"),
    (json.dumps({"format": "minidl tuning", "version": 1, "minidl": {"machine": {}, "settings": {**SETTINGS,
                                                                                            "block_bytes": -1}}}),
     "'block_bytes' must be a whole number >= 1"),
    (json.dumps({"format": "minidl tuning", "version": 1, "minidl": {"machine": {}, "settings": {
        **SETTINGS, "layouts": {"k": [[16, "sideways"]]}}}}), "layouts['k']"),
])
def test_a_file_that_is_no_tuning_file_is_an_error_naming_it(tmp_path, content, says):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=re.escape(says)) as raised:
        tuning.load(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_a_broken_tuning_file_stops_a_training_run_and_the_bench_with_one_error_line(monkeypatch, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{oops")
    monkeypatch.setitem(helpers.ENV, "MINIDL_TUNING", str(path))
    assert_stopped(launch("serial_sgd", "--epochs", "1", "--model", "mlp", ranks=1), f"tuning file {path}", ranks=1)
    done = subprocess.run([sys.executable, "-m", "minidl.bench", "sweep", "--quick", "--no-torch"], cwd=ROOT,
                          env=helpers.ENV, capture_output=True, text=True, timeout=60)
    assert_stopped(done, f"tuning file {path}: not readable JSON", ranks=1)
    assert_stopped(mpiexec(2, "-m", "collectives.bench", "--quick", timeout=60), f"tuning file {path}", ranks=2)


def test_a_broken_collectives_section_stops_a_training_run_on_every_rank(monkeypatch, tmp_path):
    """minidl's section is fine, collectives' is not one (an algorithm auto does not know): a training
    run that allreduces stops before its first epoch, as for a broken minidl section, instead of a
    note on rank 0 and a run on the shipped selection."""
    path = tuning_file(tmp_path)
    data = json.loads(path.read_text())
    data["collectives"] = {"machine": tuned.machine(), "selection": {"2": [[0, "sideways"]]}}
    path.write_text(json.dumps(data))
    monkeypatch.setitem(helpers.ENV, "MINIDL_TUNING", str(path))
    done = launch("allreduce_sgd", "--epochs", "1", "--model", "mlp", "--allreduce", "auto", ranks=2)
    assert_stopped(done, f"tuning file {path}, section collectives: selection['2']", ranks=2)


def test_the_ddp_benchmark_stops_on_a_broken_tuning_file_and_names_the_tuning_its_rows_ran_with(tmp_path):
    """A broken file: one error line, exit 2, no job started (each job failed on its own, the bench
    went on and exited 0). A file measured here: every row says it and the settings in force."""
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    done = subprocess.run([sys.executable, "-m", "algorithms.bench", "--quick", "--no-torch"], cwd=ROOT,
                          env=dict(helpers.ENV, MINIDL_TUNING=str(bad)), capture_output=True, text=True, timeout=120)
    assert_stopped(done, f"tuning file {bad}: not readable JSON", ranks=1)
    code = ("import json, sys; from algorithms import bench; "
            "bench.run_case = lambda side, model, batch, args: {'ms': 1.0, 'phases': None}; "
            f"bench.main(['--runs', '1', '--no-torch', '--cases', 'mlp:32', '--json', {str(tmp_path / 'r.json')!r}]); "
            f"print(json.dumps(json.load(open({str(tmp_path / 'r.json')!r}))))")
    (row,), _ = read_in_a_process(tuning_file(tmp_path), code)
    assert row["tuning"].startswith(f"tuned: {tmp_path / 'tuning.json'}") and row["ring_ratio"] is None
    assert row["settings"] == {**SETTINGS, "column_bytes": 5 << 20}


def test_the_collectives_bench_records_which_selection_and_calibration_it_ran_with(monkeypatch, tmp_path):
    path = tmp_path / "tuning.json"
    tuned.store(path, "selection", {"2": [[0, "ring"]]})
    monkeypatch.setitem(helpers.ENV, "MINIDL_TUNING", str(path))
    done = mpiexec(2, "-m", "collectives.bench", "--quick", "--sizes", "4K", "--algorithms", "ring,auto", "--json",
                   str(tmp_path / "bench.json"), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    records = json.loads((tmp_path / "bench.json").read_text())
    assert records and all(r["selection"] == f"tuned here: {path}" for r in records)
    assert all(r["calibration"].startswith("shipped (") for r in records), records[0]


def test_a_checkpoint_records_the_tuning_and_the_conv_settings_that_decided_its_bits(monkeypatch, tmp_path):
    monkeypatch.setitem(helpers.ENV, "MINIDL_TUNING", str(tuning_file(tmp_path)))
    done = launch("serial_sgd", "--epochs", "1", "--model", "mlp", "--save", str(tmp_path / "ck.npz"), ranks=1)
    assert done.returncode == 0, done.stderr[-2000:]
    meta = json.loads(str(numpy.load(tmp_path / "ck.npz")["meta"]))
    assert meta["tuning"].startswith(f"tuned: {tmp_path / 'tuning.json'}") and meta["conv"] == SETTINGS


def test_the_layouts_table_picks_the_row_of_the_largest_batch_not_above(monkeypatch):
    rows = {"k": [[16, "blocks"], [64, "im2col order"], [256, "batch inner"]]}
    assert [tuning.layout_for(rows, "k", b) for b in (8, 16, 63, 64, 255, 256, 4096)] == [
        "blocks", "blocks", "blocks", "im2col order", "im2col order", "batch inner", "batch inner"]
    assert tuning.layout_for(rows, "other", 64) is None


def test_the_kernel_keeps_its_columns_as_the_table_says(monkeypatch):
    """LeNet-5's conv2 at batch 64 in blocks of 256 KiB: the rule keeps them batch innermost (rows of 10);
    the table can say im2col's order, per image or none; the wide layer (input gradient by convolution) keeps none
    in im2col's order whatever the table says."""
    monkeypatch.setattr(blocked, "BLOCK_BYTES", 256 << 10)
    monkeypatch.setattr(budget, "COLUMN_BUDGET", 64 << 20)
    key = tuning.shape_key(*CONV2, 4)
    blocks = len(blocked.image_blocks(*CONV2, 4))
    assert blocks > 1 and blocked.kept_layout(*CONV2, 4, blocks) == "batch inner"
    for name, kept in (("im2col order", "im2col order"), ("blocks", None), ("batch inner", "batch inner"),
                       ("per image", "per image")):
        monkeypatch.setattr(blocked, "LAYOUTS", {key: [[1, name]]})
        assert blocked.kept_layout(*CONV2, 4, blocks) == kept, name
    wide = ((32, 16, 8, 8), (16, 16, 3, 3), 1, 1)
    monkeypatch.setattr(blocked, "LAYOUTS", {tuning.shape_key(*wide, 4): [[1, "im2col order"]]})
    assert blocked.kept_layout(*wide, 4, len(blocked.image_blocks(*wide, 4))) is None


def test_a_threshold_is_where_the_other_algorithm_stays_faster():
    sizes = [32, 64, 128]
    assert tune_conv.threshold(sizes, {32: False, 64: True, 128: True}, 256) == 64
    assert tune_conv.threshold(sizes, {32: True, 64: False, 128: True}, 256) == 128
    assert tune_conv.threshold(sizes, {32: False, 64: False, 128: False}, 256) == 256
    assert tune_conv.threshold([5, 7, 9], {5: False, 7: False, 9: False}, 7) == 18       # beyond what was measured


def test_auto_takes_fft_from_a_kernel_size_only_where_it_won_on_lenets_small_images_too(monkeypatch):
    """The kernel sweep's wide images favour FFT from 5x5; LeNet-5's 14x14 ones do not at 5x5 (as on the
    machines auto's shipped rule was measured on): the threshold is 7, not 5, so that LeNet-5's layers
    keep im2col under auto."""
    def step(batch, layer, algorithm="im2col"):
        return batch, layer, algorithm

    def interleaved(candidates, rounds, calls):
        (batch, (c, f, side, k, stride, padding), _), = {step for _, step in candidates.values()
                                                       if step[2] != "im2col"}
        other = 0.6 if side != 14 or k >= 7 else 1.2             # the other algorithm's time over im2col's
        return {name: [other if name != "im2col" else 1.0] * rounds for name in candidates}
    monkeypatch.setattr(tune_conv, "conv_step", step)
    monkeypatch.setattr(tune_conv, "interleaved", interleaved)
    winograd, fft, measured = tune_conv.thresholds(1 << 20, 1 << 20, {}, 5, 1, lambda line: None)
    assert fft == 7 and [len(measured["fft"][str(k)]) for k in (5, 7, 9)] == [2, 2, 2]
    assert winograd == 32                                      # one shape, faster at every size


def test_a_candidate_replaces_the_default_only_when_its_median_is_three_percent_faster_and_beats_the_noise():
    """Faster by the median and in so many rounds that a coin would rarely do it (all 5 of 5): one
    round of a neighbour's luck either way keeps what ships, and so do too few rounds to tell."""
    default = [10.0] * 5
    assert tune_conv.fastest({"shipped": default, "other": [9.8, 9.6, 9.9, 9.8, 9.8]}, "shipped")[0] == "shipped"
    assert tune_conv.fastest({"shipped": default, "other": [9.0, 9.5, 9.2, 9.4, 9.0]}, "shipped")[0] == "other"
    assert tune_conv.fastest({"shipped": default, "other": [9.0, 11.0, 9.5, 9.0, 9.0]}, "shipped")[0] == "shipped"
    assert tune_conv.fastest({"shipped": default, "other": [11.0, 9.0, 11.0, 9.0, 9.0]}, "shipped")[0] == "shipped"
    assert tune_conv.fastest({"shipped": [10.0] * 3, "other": [9.0] * 3}, "shipped")[0] == "shipped"


def test_the_block_size_never_buys_lenets_layers_with_a_slower_wide_layer(monkeypatch):
    """One block size serves every layer, and each layer has a target of its own: a candidate that is
    20% faster on LeNet-5's four cases but 15% slower, round after round, on the 64-channel layer is
    not taken, though its geometric mean (0.86) beats the default's by far; without that loss it is."""
    monkeypatch.setattr(tuning, "l2_bytes", lambda: 1 << 20)
    monkeypatch.setattr(tuning, "SHIPPED", tuning.replace(tuning.SHIPPED, block_bytes=2 << 20))
    monkeypatch.setattr(tune_conv, "conv_step", lambda batch, layer: layer)
    jitter = [1.0, 1.02, 0.98, 1.01, 0.99]                      # the machine's, alike for every candidate

    def race(wide_loss):
        def interleaved(candidates, rounds, calls):
            (layer,) = {step for _, step in candidates.values()}
            small = {True: wide_loss, False: 0.8}[layer == tune_conv.WIDE]
            return {size: [10.0 * (small if size == 512 << 10 else 1.0) * j for j in jitter[:rounds]]
                    for size in candidates}
        monkeypatch.setattr(tune_conv, "interleaved", interleaved)
        return tune_conv.block_size(5, 1, lambda line: None)[0]
    assert race(wide_loss=1.15) == 2 << 20
    assert race(wide_loss=1.0) == 512 << 10


@pytest.mark.parametrize("flags, env, says", [
    (["--quick"], {}, "--quick measures too little"),
    ([], {"MINIDL_TUNING": "none"}, "MINIDL_TUNING=none: no tuning file to write"),
    (["--rounds", "0", "--out", "x.json"], {}, "--rounds must be at least 1"),
    ([], {"MINIDL_TUNING": "/"}, "MINIDL_TUNING /: a folder"),          # where the path came from, not --out
    (["--out", "/"], {}, "--out /: a folder"),
])
def test_the_tuner_refuses_bad_flags_with_one_error_line(flags, env, says):
    done = subprocess.run([sys.executable, "-m", "minidl.tune", *flags], env=dict(helpers.ENV, **env), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert_stopped(done, says, ranks=1)


def test_the_tuner_never_overwrites_a_file_that_is_no_tuning_file(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("[1, 2, 3]")
    done = subprocess.run([sys.executable, "-m", "minidl.tune", "--out", str(other), "--quick"], env=helpers.ENV,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert_stopped(done, "not overwritten", ranks=1)
    assert other.read_text() == "[1, 2, 3]"


def test_a_quick_tuning_writes_a_file_both_packages_read_back(tmp_path):
    """The tuner's smallest run, minidl's races and collectives' calibration and selection at p = 2: a file
    minidl takes as tuned (its settings in force) and collectives' auto and calibration read."""
    path = tmp_path / "tuning.json"
    done = subprocess.run([sys.executable, "-m", "minidl.tune", "--quick", "--rounds", "1", "--calls", "1",
                           "--out", str(path)], env=helpers.ENV, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    written = json.loads(path.read_text())
    settings = written["minidl"]["settings"]
    seen, _ = read_in_a_process(path, SETTINGS_IN_FORCE)
    assert seen == [settings[key] for key in ("block_bytes", "column_bytes", "layouts", "winograd_min_channels",
                                              "fft_min_kernel")]
    assert written["minidl"]["machine"] == tuning.machine()
    code = ("import json; from collectives import auto; from collectives.model import calibration; "
            "print(json.dumps([auto.source(2), auto.table(2), calibration.tuned_or_shipped()[1]]))")
    (source, table, calibrated), _ = read_in_a_process(path, code)
    assert source.startswith("tuned here") and calibrated.startswith("tuned here")
    assert [list(row) for row in table] == written["collectives"]["selection"]["2"]


def test_collectives_refuses_another_machines_section_and_names_a_bad_one(tmp_path):
    path = tmp_path / "tuning.json"
    tuned.store(path, "selection", {"2": [[0, "ring"]]})
    assert tuned.load(path)[0]["selection"] == {"2": [[0, "ring"]]}
    section, note = tuned.load(path, here=dict(tuned.machine(), mpi="Open MPI 9"))
    assert section is None and "refused" in note and "mpi 'Open MPI 9' here" in note
    tuned.store(path, "selection", {"2": [[0, "sideways"]]})
    with pytest.raises(ValueError, match=f"tuning file {path}, section collectives: selection"):
        tuned.load(path)


def test_calibrate_with_no_tuning_file_to_write_is_refused(capsys, monkeypatch):
    from collectives.bench import flags
    monkeypatch.setenv("MINIDL_TUNING", "none")
    with pytest.raises(SystemExit) as stop:
        flags.settings(["--quick", "--calibrate"], 2)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--calibrate: MINIDL_TUNING=none" in err and err.count("\n") == 1, err


def test_the_shipped_defaults_are_what_a_machine_that_never_tuned_runs():
    """Under this suite's MINIDL_TUNING=none: twice the L2 cache, 64 MiB, no layouts table, 256 and 7."""
    assert tuning.ACTIVE == tuning.SHIPPED and blocked.BLOCK_BYTES == 2 * (tuning.l2_bytes() or 1 << 20)
    assert (budget.DEFAULT_BYTES, blocked.LAYOUTS, auto.WINOGRAD_MIN_CHANNELS, auto.FFT_MIN_KERNEL) == (
        64 << 20, {}, 256, 7)
