"""The calibrated cost model (collectives.calibration, cost.predict_calibrated) and the bench's flags.

The fit runs on synthetic measurements made here from known parameters (no timing), and must give
them back; the prediction is checked against the model's formula written out by hand; bad
calibration files and bad flags stop `collectives.bench` on every rank with one `error:` line and
exit status 2 before any message.
"""
import json

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives import bench, calibrate, calibration, cost
from tests.helpers import assert_stopped, mpiexec, same_on_every_rank

KIB, MIB = 1 << 10, 1 << 20
LADDER = [1 << k for k in range(12, 27)]                  # 4 KiB .. 64 MiB: synthetic, three levels
TRUE_BOUNDS = (3 * 48 * KIB, 3 * 1536 * KIB)             # footprints: n <= 48 KiB, n <= 1.5 MiB, beyond
TRUE_ALPHA = (4e-6, 15e-6, 30e-6)
TRUE = {"beta_x": (1.2e-11, 1.5e-10, 4e-10), "beta_1": (1.0e-11, 1.2e-10, 3e-10),
        "gamma_m": (0.5e-11, 3e-11, 1e-10), "gamma_3": (0.7e-11, 5e-11, 1.5e-10), "copy": (0.4e-11, 2e-11, 9e-11)}
TRUE_O = {"naive": 2e-6, "tree": 3e-6, "butterfly": 1e-6, "ring": 5e-6, "rabenseifner": 6e-6}
STEPS_AT_P2 = {"naive": 2, "tree": 2, "butterfly": 1, "ring": 2, "rabenseifner": 2}   # by hand: 2 ranks
# a hot step's own rates per level (it sends what a reduction just wrote), unlike a cold step's
TRUE_HOT = {"hot_alpha_x": (6e-6, 20e-6, 50e-6), "hot_beta_x": (2e-11, 3e-10, 5e-10),
            "hot_alpha_1": (5e-6, 25e-6, 40e-6), "hot_beta_1": (3e-11, 2e-10, 6e-10)}


def level(n):
    return sum(3 * n > bound for bound in TRUE_BOUNDS)


def synthetic_ladder():
    """What the micro-benchmarks would measure on a machine that follows the model exactly."""
    rows = []
    for n in LADDER:
        k = level(n)
        row = {"bytes": n, "beta_x": TRUE_ALPHA[k] + n * TRUE["beta_x"][k],
               "beta_1": 2 * TRUE_ALPHA[k] + n * TRUE["beta_1"][k]}     # a one-way send's own intercept
        row.update({name: n * TRUE[name][k] for name in ("gamma_m", "gamma_3", "copy")})
        rows.append(row)
    return rows


def with_pairs(rows):
    """The ladder plus what calibrate.fit_hot_steps would measure: a hot step of n/2 bytes
    exchanged and of n bytes one way at TRUE_HOT, inside pairs that also hold a cold step and an add."""
    for row in rows:
        n, k = row["bytes"], level(row["bytes"])
        hot_x = TRUE_HOT["hot_alpha_x"][k] + n / 2 * TRUE_HOT["hot_beta_x"][k]
        hot_1 = TRUE_HOT["hot_alpha_1"][k] + n * TRUE_HOT["hot_beta_1"][k]
        row.update(hot_x=hot_x, pair_x=hot_x + TRUE_ALPHA[k] + n / 2 * (TRUE["beta_x"][k] + TRUE["gamma_3"][k]),
                   hot_1=hot_1, pair_1=hot_1 + TRUE_ALPHA[k] + n * (TRUE["beta_1"][k] + TRUE["gamma_3"][k]))
    return rows


def synthetic_small():
    """8-byte allreduces: o + steps alpha (the per-byte terms at 8 B are below 1e-9 s with these rates)."""
    return {name: TRUE_O[name] + STEPS_AT_P2[name] * TRUE_ALPHA[0] for name in TRUE_O}


def test_fitting_measurements_made_from_known_parameters_gives_them_back():
    model = calibration.fit(synthetic_ladder(), synthetic_small(), p=2, levels=3)
    assert model.p == 2 and len(model.bounds) == 2
    for true, fitted, n in zip(TRUE_BOUNDS, model.bounds, (48 * KIB, 1536 * KIB)):
        below = max(m for m in LADDER if m <= n)           # the cut lies between the two ladder sizes around n
        assert 3 * below < fitted < 3 * 2 * below, (true, fitted)
    assert model.alpha == pytest.approx(TRUE_ALPHA, rel=1e-6)
    for name, rates in TRUE.items():
        assert model.rates[name] == pytest.approx(rates, rel=1e-6), name
    for name, o in TRUE_O.items():
        assert abs(model.overhead[name] - o) < 1e-9, name


def test_a_hot_steps_rates_come_back_from_pairs_made_with_them():
    model = calibration.fit(with_pairs(synthetic_ladder()), synthetic_small(), p=2, levels=3)
    assert model.alpha == pytest.approx(TRUE_ALPHA, rel=1e-6)
    for name, rates in TRUE_HOT.items():
        assert model.hot[name] == pytest.approx(rates, rel=1e-6), name
    for name, o in TRUE_O.items():             # the 8-byte allreduces: a hot step at its own alpha
        hot = {"naive": "1", "tree": "1", "ring": "x", "rabenseifner": "x"}.get(name)
        steps = TRUE_ALPHA[0] + (TRUE_HOT[f"hot_alpha_{hot}"][0] if hot else 0.0)
        assert abs(model.overhead[name] - (synthetic_small()[name] - steps)) < 1e-9, name


def test_without_pairs_the_fit_has_no_hot_rates():
    assert calibration.fit(synthetic_ladder(), synthetic_small(), p=2, levels=3).hot is None


def test_two_levels_find_the_larger_jump():
    """Asked for two levels on a ladder whose rates jump once (at 1 MiB), the cut lands there."""
    rows = [{"bytes": n, "beta_x": 5e-6 + n * (1e-10 if n <= MIB else 5e-10), "beta_1": 5e-6 + n * 1e-10,
             "gamma_m": n * 1e-11, "gamma_3": n * 1e-11, "copy": n * (1e-11 if n <= MIB else 4e-11)} for n in LADDER]
    model = calibration.fit(rows, synthetic_small(), p=2, levels=2)
    assert 3 * MIB < model.bounds[0] < 3 * 2 * MIB
    assert model.rates["beta_x"] == pytest.approx((1e-10, 5e-10), rel=1e-6)


def hand_model():
    rates = {name: values for name, values in TRUE.items()}
    return calibration.Calibration(2, dict(TRUE_O), TRUE_ALPHA, TRUE_BOUNDS, rates)


@pytest.mark.parametrize("n", [32 * KIB, 64 * KIB, 1 * MIB, 32 * MIB])
def test_the_calibrated_ring_at_p2_is_its_formula_at_the_footprints_level(n):
    """Ring, p = 2, out of place: o + 2 alpha[k] + n beta_x[k] (two exchanges of n/2) + n/2 gamma_3[k]
    (one reduction of half the vector, read from sendbuf), k the level of 3 n."""
    k = level(n)
    expected = TRUE_O["ring"] + 2 * TRUE_ALPHA[k] + n * TRUE["beta_x"][k] + n / 2 * TRUE["gamma_3"][k]
    assert cost.predict_calibrated("ring", 2, n, hand_model()) == pytest.approx(expected, rel=1e-12)


def test_the_calibrated_tree_at_p2_sends_one_way():
    """Tree, p = 2: o + 2 alpha + 2 n beta_1 (up and down, one pair alone) + n gamma_3 (root's reduction)."""
    n, k = 256 * KIB, 1
    expected = TRUE_O["tree"] + 2 * TRUE_ALPHA[k] + 2 * n * TRUE["beta_1"][k] + n * TRUE["gamma_3"][k]
    assert cost.predict_calibrated("tree", 2, n, hand_model()) == pytest.approx(expected, rel=1e-12)


def test_the_ladder_gives_messages_under_8_kib_a_level_of_their_own():
    """MPICH's single copy (CMA) starts at 8 KiB: below it the bench's default fit has room for a
    level of its own, and on a ladder whose messages jump there the cut lands between 4 and 8 KiB."""
    eager = [n for n in calibrate.LADDER if n < 8 * KIB]
    assert len(eager) >= calibration.MIN_RUN and bench.settings(["--quick"], 2).levels == 4
    rows = [{"bytes": n, "beta_x": (3e-6 if n < 8 * KIB else 6e-6) + n * 1e-10,
             "beta_1": (1.5e-6 if n < 8 * KIB else 5e-6) + n * 1e-10,
             "gamma_m": n * 1e-11, "gamma_3": n * 1e-11, "copy": n * 1e-11} for n in calibrate.LADDER]
    model = calibration.fit(rows, synthetic_small(), p=2, levels=4)
    assert 3 * 4 * KIB < model.bounds[0] < 3 * 8 * KIB


def hot_model():
    return calibration.Calibration(2, dict(TRUE_O), TRUE_ALPHA, TRUE_BOUNDS, dict(TRUE), hot=dict(TRUE_HOT))


@pytest.mark.parametrize("n", [32 * KIB, 1 * MIB, 32 * MIB])
def test_the_ring_at_p2_pays_its_second_exchange_at_the_hot_rates(n):
    """o + (alpha + n/2 beta_x) first + (hot alpha_x + n/2 hot beta_x) second, the reduced half + n/2 gamma_3."""
    k = level(n)
    expected = (TRUE_O["ring"] + TRUE_ALPHA[k] + n / 2 * TRUE["beta_x"][k] + TRUE_HOT["hot_alpha_x"][k]
                + n / 2 * TRUE_HOT["hot_beta_x"][k] + n / 2 * TRUE["gamma_3"][k])
    assert cost.predict_calibrated("ring", 2, n, hot_model()) == pytest.approx(expected, rel=1e-12)


def test_the_tree_at_p2_sends_back_at_the_hot_one_way_rates():
    n, k = 256 * KIB, 1
    expected = (TRUE_O["tree"] + TRUE_ALPHA[k] + n * TRUE["beta_1"][k] + TRUE_HOT["hot_alpha_1"][k]
                + n * TRUE_HOT["hot_beta_1"][k] + n * TRUE["gamma_3"][k])
    assert cost.predict_calibrated("tree", 2, n, hot_model()) == pytest.approx(expected, rel=1e-12)


def test_the_butterfly_at_p2_sends_only_sendbuf_so_nothing_hot():
    n = 256 * KIB
    assert (cost.predict_calibrated("butterfly", 2, n, hot_model())
            == cost.predict_calibrated("butterfly", 2, n, hand_model()))


@pytest.mark.parametrize("algorithm, p, expected", [          # by hand, n = 1: (exchanges, bytes, one-way, bytes)
    ("ring", 2, (1, 0.5, 0, 0)), ("rabenseifner", 2, (1, 0.5, 0, 0)), ("butterfly", 2, (0, 0, 0, 0)),
    ("tree", 2, (0, 0, 1, 1)), ("naive", 2, (0, 0, 1, 1)),
    ("ring", 4, (3, 0.75, 0, 0)), ("rabenseifner", 4, (2, 0.5, 0, 0)), ("butterfly", 4, (1, 1.0, 0, 0)),
    ("tree", 4, (0, 0, 2, 2)), ("naive", 4, (0, 0, 1, 1)),
    ("ring", 8, (7, 0.875, 0, 0)), ("rabenseifner", 8, (3, 0.5, 0, 0)), ("butterfly", 8, (2, 2.0, 0, 0)),
    ("ring", 6, (5, 5 / 6, 0, 0)), ("rabenseifner", 6, (3, 1.0, 0, 0)), ("butterfly", 6, (2, 2.0, 1, 1)),
    ("tree", 6, (0, 0, 3, 3)), ("lower bound", 4, (0, 0, 0, 0)), ("ring", 1, (0, 0, 0, 0)),
])
def test_hot_steps_are_the_sends_of_what_the_senders_reduction_just_wrote(algorithm, p, expected):
    steps_x, bytes_x, steps_1, bytes_1 = calibration.hot_steps(algorithm, p, 1 << 20)
    assert (steps_x, bytes_x / MIB, steps_1, bytes_1 / MIB) == pytest.approx(expected)


def test_a_calibration_with_hot_rates_reads_back_equal(tmp_path):
    path = tmp_path / "c.json"
    calibration.save(hot_model(), path)
    assert calibration.load(path) == hot_model()
    assert "hot_beta_x" not in hand_model().as_json()      # an older file's form, still read: see hand_model


@pytest.mark.parallel(nprocs=[2, 3])
def test_the_two_step_micro_benchmark_runs_on_every_rank_and_agrees():
    """On 3 ranks the last has no partner and idles; every rank gets the slowest rank's numbers."""
    comm = MPI.COMM_WORLD
    seconds = calibrate.fit_hot_steps(comm, 1e-4, 4 * KIB, rounds=1)
    names = ("pair_x", "first_x", "reduce_x", "pair_1", "first_1", "reduce_1", "pair_1_cold")
    parallel_assert(set(seconds) == set(names) | {"hot_x", "hot_1"}, f"{sorted(seconds)}")
    numbers = np.array([seconds[name] for name in names])
    parallel_assert(bool(np.all(np.isfinite(numbers)) and np.all(numbers > 0)), f"{seconds}")
    parallel_assert(seconds["hot_1"] == seconds["pair_1"] - seconds["first_1"] - seconds["reduce_1"], f"{seconds}")
    parallel_assert(same_on_every_rank(comm, numbers), "ranks disagree")


def test_calibration_none_leaves_the_column_out():
    assert bench.settings(["--quick", "--calibration", "none"], 2).model is None


def test_a_written_calibration_reads_back_equal(tmp_path):
    path = tmp_path / "c.json"
    calibration.save(hand_model(), path, {"ladder": []})
    assert calibration.load(path) == hand_model()


def bad_files(folder):
    good = hand_model().as_json()
    cases = {"not json": "{oops", "a list": [1, 2], "no alpha": {k: v for k, v in good.items() if k != "alpha"},
             "negative rate": {**good, "gamma_3": [-1e-11, 5e-11, 1.5e-10]},
             "wrong length": {**good, "beta_x": [1e-10, 2e-10]},
             "bounds descending": {**good, "bounds": [9e6, 1e6]},
             "missing algorithm": {**good, "overhead": {"ring": 1e-6}},
             "p zero": {**good, "p": 0}, "nan": {**good, "copy": [float("nan"), 1.0, 1.0]},
             "half of hot": {**good, "hot_alpha_x": [1e-6] * 3, "hot_beta_x": [1e-10] * 3},
             "negative hot": {**hot_model().as_json(), "hot_beta_1": [1e-10, -1e-10, 1e-10]}}
    paths = {}
    for name, content in cases.items():
        paths[name] = folder / f"{name.replace(' ', '_')}.json"
        paths[name].write_text(content if isinstance(content, str) else json.dumps(content))
    return paths


def test_bad_calibration_files_are_refused_with_what_is_wrong(tmp_path):
    for name, path in bad_files(tmp_path).items():
        with pytest.raises(ValueError, match=f"--calibration {path}: ") as raised:
            calibration.load(path)
        assert "\n" not in str(raised.value), name


@pytest.mark.parametrize("flags, message", [
    (["--sizes", "4K,3X"], "--sizes 4K,3X"),
    (["--sizes", "6"], "multiple of 4"),
    (["--algorithms", "ring,bogus"], "unknown bogus"),
    (["--rounds", "0"], "--rounds must be an integer >= 1"),
    (["--min-time", "nan"], "--min-time must be a finite number"),
    (["--json", "/nonexistent-folder/x.json"], "--json /nonexistent-folder/x.json"),
    (["--calibration", "/nonexistent-folder/c.json"], "--calibration /nonexistent-folder/c.json: no such file"),
    (["--calibrate", "--levels", "9"], "--levels 9"),
    (["--calibrate", "--calibration", "none"], "--calibrate needs a --calibration file"),
])
def test_bad_bench_flags_are_one_error_line_and_status_2(flags, message, capsys):
    """The checks every rank runs on its own argv (bench.settings), here on one process."""
    with pytest.raises(SystemExit) as stop:
        bench.settings(["--quick", *flags], 2)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("flags, message", [
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--sizes", "6"], "multiple of 4"),
])
def test_bad_bench_flags_stop_every_rank_before_any_message(flags, message):
    done = mpiexec(2, "-m", "collectives.bench", "--quick", *flags, timeout=60)
    assert_stopped(done, message, ranks=2)
    assert done.stdout == "", done.stdout                   # nothing measured, nothing printed


def test_a_bad_calibration_file_stops_the_bench(tmp_path):
    path = bad_files(tmp_path)["negative rate"]
    assert_stopped(mpiexec(2, "-m", "collectives.bench", "--quick", "--calibration", str(path), timeout=60),
                   f"--calibration {path}: 'gamma_3' must be a finite number >= 0", ranks=2)
