"""The calibrated cost model (collectives.model.calibration, cost.predict_calibrated) and the bench's flags.

The fit runs on synthetic measurements made here from known parameters (no timing), and must give
them back; the prediction is checked against the model's formula written out by hand; bad
calibration files and bad flags stop `collectives.bench` on every rank with one `error:` line and
exit status 2 before any message.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from pytest_mpi import parallel_assert

from collectives.bench import calibrate, measure
from collectives.model import calibration, cost
from tests.helpers import ROOT, assert_stopped, mpiexec, same_on_every_rank

KIB, MIB = 1 << 10, 1 << 20
SIZES = (4 * KIB, 64 * KIB, 1 * MIB, 16 * MIB)          # a synthetic ladder: n, ascending
TRUE_O = {"naive": 2e-6, "tree": 3e-6, "butterfly": 1e-6, "ring": 5e-6, "rabenseifner": 6e-6}
# seconds at each size of SIZES, as calibrate.fit_steps would measure them on a machine
TRUE = {"exchange": (4e-6, 10e-6, 60e-6, 900e-6), "exchange_whole": (5e-6, 16e-6, 110e-6, 1900e-6),
        "one_way": (3e-6, 14e-6, 100e-6, 1700e-6), "hot_exchange": (2e-6, 12e-6, 90e-6, 1000e-6),
        "hot_one_way": (1e-6, 20e-6, 150e-6, 2000e-6), "reduce": (0.5e-6, 3e-6, 40e-6, 1200e-6),
        "add": (0.4e-6, 2e-6, 30e-6, 1000e-6), "copy": (0.3e-6, 1.5e-6, 25e-6, 800e-6)}
HALF = {"exchange": 0.5, "hot_exchange": 0.5}            # an exchange moves n/2 bytes at p = 2, the rest n


def synthetic_ladder(hot_noise=0.0):
    """What calibrate.measure_calibration would return on a machine with these step times: the raw
    micro-benchmarks, pairs included, each pair made of its parts and its hot step."""
    rows = []
    for k, n in enumerate(SIZES):
        t = {name: values[k] for name, values in TRUE.items()}
        rows.append({"bytes": n, "exchange": t["exchange"], "exchange_whole": t["exchange_whole"],
                     "one_way": t["one_way"], "add_into": 0.8 * t["reduce"], "add": t["add"], "copy": t["copy"],
                     "pair_w": t["exchange_whole"] + t["reduce"],
                     "pair_x": t["exchange"] + t["reduce"] / 2 + t["hot_exchange"] + hot_noise,
                     "pair_1": t["one_way"] + t["reduce"] + t["hot_one_way"], "pair_1_cold": t["one_way"] * 2})
        rows[-1].update(calibrate.derived(rows[-1]))
    return rows


def synthetic_small():
    """8-byte allreduces at p = 2: o + each step's latency (its time at the first size) + the
    reduction of 8 bytes at the first size's rate (below the first size: that size's time), by hand."""
    first = {name: values[0] for name, values in TRUE.items()}
    steps = {"naive": first["one_way"] + first["hot_one_way"], "tree": first["one_way"] + first["hot_one_way"],
             "butterfly": first["exchange_whole"], "ring": first["exchange"] + first["hot_exchange"],
             "rabenseifner": first["exchange"] + first["hot_exchange"]}
    reduced = {"naive": 8, "tree": 8, "butterfly": 8, "ring": 4, "rabenseifner": 4}
    return {name: TRUE_O[name] + steps[name] + first["reduce"] * reduced[name] / 8 for name in TRUE_O}


def hand_model():
    return calibration.Calibration(2, dict(TRUE_O), SIZES, dict(TRUE))


def test_the_fit_keeps_each_step_time_and_takes_o_from_the_8_byte_allreduces():
    model = calibration.fit(synthetic_ladder(), synthetic_small(), p=2)
    assert model.p == 2 and model.sizes == SIZES
    for name, values in TRUE.items():
        assert model.tables[name] == pytest.approx(values, rel=1e-9), name
    for name, o in TRUE_O.items():
        assert abs(model.overhead[name] - o) < 1e-12, name


def test_the_reduction_is_the_butterflys_pair_less_its_exchange_not_the_add_timed_alone():
    """add_into alone (0.8 of reduce here) stays in the file's measurements; the model prices
    reduce = pair_w - exchange_whole, a reduction right after the message that brought its operand."""
    model = calibration.fit(synthetic_ladder(), synthetic_small(), p=2)
    assert model.tables["reduce"] == pytest.approx(TRUE["reduce"], rel=1e-9)
    assert "add_into" not in model.tables


def test_a_hot_step_below_zero_is_kept_at_zero():
    rows = synthetic_ladder(hot_noise=-1.0)                # pair_x 1 s faster than its parts: noise
    model = calibration.fit(rows, synthetic_small(), p=2)
    assert model.tables["hot_exchange"] == (0.0,) * len(SIZES)


def test_interpolation_is_linear_between_sizes_flat_below_and_extended_beyond():
    sizes, seconds = (100, 200, 400), (1.0, 3.0, 4.0)
    assert calibration.interpolate(sizes, seconds, 150) == pytest.approx(2.0)
    assert calibration.interpolate(sizes, seconds, 300) == pytest.approx(3.5)
    assert calibration.interpolate(sizes, seconds, 200) == pytest.approx(3.0)
    assert calibration.interpolate(sizes, seconds, 10) == 1.0           # below the first: its time
    assert calibration.interpolate(sizes, seconds, 800) == pytest.approx(6.0)      # the last slope, 1/200
    assert calibration.interpolate(sizes, (5.0, 3.0, 1.0), 1000) == 0.0           # never below 0


def beta(kind, k):
    """seconds per byte of kind at SIZES[k], by hand: (T - T[first]) / bytes moved."""
    return (TRUE[kind][k] - TRUE[kind][0]) / (HALF.get(kind, 1.0) * SIZES[k])


@pytest.mark.parametrize("k", range(len(SIZES)))
def test_at_p2_each_algorithm_is_o_plus_its_steps_as_measured(k):
    """At p = 2 the model gives back the measured steps: ring and Rabenseifner o + exchange + hot
    exchange + reduce / 2 (= o + pair_x), tree and naive o + one way + hot one way + reduce
    (= o + pair_1), the butterfly o + whole exchange + reduce (= o + pair_w)."""
    n, t = SIZES[k], {name: values[k] for name, values in TRUE.items()}
    expected = {"ring": t["exchange"] + t["hot_exchange"] + t["reduce"] / 2,
                "rabenseifner": t["exchange"] + t["hot_exchange"] + t["reduce"] / 2,
                "tree": t["one_way"] + t["hot_one_way"] + t["reduce"],
                "naive": t["one_way"] + t["hot_one_way"] + t["reduce"],
                "butterfly": t["exchange_whole"] + t["reduce"]}
    for name, steps in expected.items():
        assert cost.predict_calibrated(name, 2, n, hand_model()) == pytest.approx(TRUE_O[name] + steps, rel=1e-12), name


def test_between_ladder_sizes_the_step_times_are_interpolated():
    n = 640 * KIB                                        # 0.6 of the way from 64 KiB to 1 MiB
    w = 0.6
    t = {name: values[1] + w * (values[2] - values[1]) for name, values in TRUE.items()}
    expected = TRUE_O["butterfly"] + t["exchange_whole"] + t["reduce"]
    assert cost.predict_calibrated("butterfly", 2, n, hand_model()) == pytest.approx(expected, rel=1e-12)


def test_the_ring_at_p4_prices_three_cold_and_three_hot_blocks_of_n_over_4():
    """Ring, p = 4: 6 exchanges of n/4, 3 of them hot (hot_steps), and 3 n/4 bytes reduced from
    sendbuf: 3 (alpha_x + n/4 beta_x) + 3 (alpha_hx + n/4 beta_hx) + 3/4 reduce(n), o the ring's."""
    k, n = 2, SIZES[2]
    expected = (TRUE_O["ring"] + 3 * (TRUE["exchange"][0] + n / 4 * beta("exchange", k))
                + 3 * (TRUE["hot_exchange"][0] + n / 4 * beta("hot_exchange", k)) + 0.75 * TRUE["reduce"][k])
    assert cost.predict_calibrated("ring", 4, n, hand_model()) == pytest.approx(expected, rel=1e-12)


def test_the_butterfly_at_p4_pays_whole_vectors_and_a_hot_surcharge_on_its_second_round():
    """Butterfly, p = 4, out of place: 2 whole exchanges of n; the second sends the first round's
    sum, so it costs what heat adds to a block exchange of n bytes, (alpha_hx + n beta_hx) -
    (alpha_x + n beta_x); the first round reduces from sendbuf, the second in place, and one whole
    copy brings the result back from the scratch vector."""
    k, n = 3, SIZES[3]
    expected = (TRUE_O["butterfly"] + 2 * (TRUE["exchange_whole"][0] + n * beta("exchange_whole", k))
                + (TRUE["hot_exchange"][0] + n * beta("hot_exchange", k)) - (TRUE["exchange"][0] + n * beta("exchange",
                                                                                                            k))
                + TRUE["reduce"][k] + TRUE["add"][k] + TRUE["copy"][k])
    assert cost.predict_calibrated("butterfly", 4, n, hand_model()) == pytest.approx(expected, rel=1e-12)


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


@pytest.mark.parallel(nprocs=[2, 3])
def test_the_step_micro_benchmarks_run_on_every_rank_and_agree():
    """On 3 ranks the last has no partner and idles; every rank gets the slowest rank's numbers."""
    comm = MPI.COMM_WORLD
    seconds = calibrate.fit_steps(comm, 1e-4, 4 * KIB, rounds=1)
    names = ("exchange", "exchange_whole", "one_way", "add_into", "add", "copy", "pair_w", "pair_x", "pair_1",
             "pair_1_cold")
    parallel_assert(set(seconds) == set(names) | {"reduce", "hot_exchange", "hot_one_way"}, f"{sorted(seconds)}")
    numbers = np.array([seconds[name] for name in names])
    parallel_assert(bool(np.all(np.isfinite(numbers)) and np.all(numbers > 0)), f"{seconds}")
    reduce = seconds["pair_w"] - seconds["exchange_whole"]
    parallel_assert(seconds["hot_one_way"] == seconds["pair_1"] - seconds["one_way"] - reduce, f"{seconds}")
    parallel_assert(seconds["hot_exchange"] == seconds["pair_x"] - seconds["exchange"] - reduce / 2, f"{seconds}")
    parallel_assert(same_on_every_rank(comm, numbers), "ranks disagree")


@pytest.mark.parallel(nprocs=[2])
def test_the_calibration_hands_over_after_each_size_of_each_round():
    """collectives.bench times a size's allreduces right after that size's steps (between(n)), and
    the rows off the ladder at each round's end (between(None)); the best of the rounds is kept."""
    comm = MPI.COMM_WORLD
    seen = []
    ladder, small = calibrate.measure_calibration(comm, 1e-4, rounds=2, sizes=[512, 1024], between=seen.append)
    parallel_assert(seen == [512, 1024, None, 512, 1024, None], f"{seen}")
    parallel_assert([row["bytes"] for row in ladder] == [512, 1024] and set(small) == set(cost.ALGORITHMS),
                    f"{ladder}, {small}")


def test_the_bench_turns_transparent_huge_pages_off_for_itself():
    """Linux reports THP_enabled: 0 in /proc/self/status once prctl(PR_SET_THP_DISABLE) took."""
    status = Path("/proc/self/status")
    if not status.is_file() or "THP_enabled" not in status.read_text():
        pytest.skip("no THP_enabled line in /proc/self/status (not Linux >= 5.0)")
    code = ("from collectives.bench import measure; took = measure.small_pages(); "
            "print(took, [l for l in open('/proc/self/status') if l.startswith('THP_enabled')][0].split()[1])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.split() == ["True", "0"], done.stdout + done.stderr


def test_calibration_none_leaves_the_column_out():
    assert measure.settings(["--quick", "--calibration", "none"], 2).model is None


def test_a_written_calibration_reads_back_equal(tmp_path):
    path = tmp_path / "c.json"
    calibration.save(hand_model(), path, {"ladder": []})
    assert calibration.load(path) == hand_model()


def bad_files(folder):
    good = hand_model().as_json()
    earlier = {"p": 2, "levels": 2, "footprint": 3, "overhead": dict(TRUE_O), "alpha": [1e-6, 2e-6],
               "bounds": [1e6], **{name: [1e-10, 2e-10] for name in ("beta_x", "beta_1", "gamma_m", "gamma_3", "copy")}}
    cases = {"not json": "{oops", "a list": [1, 2], "no reduce": {k: v for k, v in good.items() if k != "reduce"},
             "negative time": {**good, "reduce": [-1e-6, 3e-6, 4e-5, 1e-3]},
             "wrong length": {**good, "exchange": [1e-6, 2e-6]},
             "sizes descending": {**good, "sizes": [16 * MIB, 1 * MIB, 64 * KIB, 4 * KIB]},
             "one size": {**good, "sizes": [4 * KIB], **{name: [1e-6] for name in calibration.TABLES}},
             "missing algorithm": {**good, "overhead": {"ring": 1e-6}},
             "p zero": {**good, "p": 0}, "nan": {**good, "copy": [float("nan"), 1.0, 1.0, 1.0]},
             "earlier form": earlier}
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
    (["--calibrate", "--levels", "4"], "unrecognized arguments: --levels"),
    (["--calibrate", "--calibration", "none"], "--calibrate needs a --calibration file"),
])
def test_bad_bench_flags_are_one_error_line_and_status_2(flags, message, capsys):
    """The checks every rank runs on its own argv (measure.settings), here on one process."""
    with pytest.raises(SystemExit) as stop:
        measure.settings(["--quick", *flags], 2)
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
    path = bad_files(tmp_path)["negative time"]
    assert_stopped(mpiexec(2, "-m", "collectives.bench", "--quick", "--calibration", str(path), timeout=60),
                   f"--calibration {path}: 'reduce' must be a finite number >= 0", ranks=2)
