"""Chapter 9, section 3: the search tables, the protocol and its verdict are what the JSON says.

tutorials/figures/make_09_figures.py writes one JSON per comparison (09_search_long, 09_search_short:
the exploration on seeds 0-15; 09_confirm, 09_confirm_long: the protocol's runs on seeds 16-47) and
a table from each. Checked here:
- each table is what ``search_table`` makes of its JSON, and the chapter holds it verbatim;
- the confirmation tested what the protocol names: pbt's defaults (read from its own parser), the
  seeds 16-47 and no seed the exploration had used;
- the verdict ("met" only if the mean difference in test accuracy is positive and the sign-flip
  p < 0.05) and every number quoted about it in the chapter and the answers
  are recomputed from the JSON with the rounding the prose uses;
- ``sign_flip_p`` (two halves, binary search) counts the same flips as visiting all 2^n of them;
- the quick mode of the search part runs.
Rerunning the script changes no accuracy (same seed, same bits), so these fail only when the text,
the defaults or the script change without the others.
"""
import ast
import importlib.util
import inspect
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from algorithms import pbt
from algorithms.core.objective import load_data
from tutorials import assignments

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "tutorials" / "figures"
OUT = FIGURES / "out"                    # what the figure scripts wrote
SCRIPT = FIGURES / "make_09_figures.py"


def script():
    spec = importlib.util.spec_from_file_location("make_09_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flat(path):
    return " ".join(Path(path).read_text().split())


def results(name):
    return json.loads((OUT / f"09_{name}.json").read_text())


def seeds_of(found):
    return sorted({int(key.split("|")[1]) for key in found})


def paired(found, method="pbt", key="test_accuracy"):
    """Per seed, ``method`` minus random search."""
    return [found[f"{method}|{seed}"]["final"][key] - found[f"random|{seed}"]["final"][key] for seed in seeds_of(found)]


def test_the_search_tables_are_what_the_script_makes_of_the_json_and_the_chapter_quotes_them():
    make = script()
    chapter = flat(ROOT / "tutorials" / "09_large_batch_and_search.md")
    for name in make.SEARCHES:
        found = results(name)
        table = "\n".join(make.search_table(found, seeds_of(found))) + "\n"
        assert table == (OUT / f"09_table_{name}.md").read_text(), f"09_table_{name}.md is not its JSON's table"
        assert " ".join(table.split()) in chapter, f"chapter 9's copy of 09_table_{name}.md is stale"


def test_each_confirmation_ran_its_protocols_setting_on_seeds_no_earlier_run_had_used(monkeypatch):
    """The first protocol ran 6 x 20 (then the defaults) on 16-47, with 12 x 40 beside it; the second
    runs pbt's defaults now (read from its own parser and train()) on 48-79."""
    make = script()
    given_flags = {}
    monkeypatch.setattr(pbt.cli, "run_main", lambda train, args, **flags: given_flags.update(flags))
    pbt.main([])                                                  # the parser's defaults, nothing trained
    used = set(seeds_of(results("search_long"))) | set(seeds_of(results("search_short")))
    short = {"rounds": 6, "ready": 20, "ready_batch": 32, "fraction": 0.25}
    long = {"rounds": 12, "ready": 40, "ready_batch": 32, "fraction": 0.25}
    for name, seeds, setting_wanted in [("confirm", range(16, 48), short), ("confirm_long", range(16, 48), long),
                                        ("reconfirm", range(48, 80), {flag: given_flags[flag] for flag in long})]:
        found = results(name)
        assert seeds_of(found) == list(seeds) == list(make.SEARCHES[name][1])
        if name != "confirm_long":               # it shares the first confirmation's seeds by design
            assert not used & set(seeds_of(found)), f"{name}: a confirming seed was used before"
            used |= set(seeds_of(found))
        assert {key.split("|")[0] for key in found} == set(make.METHODS)
        for run in found.values():
            lineage = run["lineage"]
            assert {flag: lineage[flag] for flag in setting_wanted} == setting_wanted, name
            assert lineage["population"] == 4
    assert given_flags["population"] is None and {flag: given_flags[flag] for flag in long} == long
    # train()'s own defaults are the parser's, so pbt.train(comm) runs the confirmed setting too
    for flag in ("rounds", "ready", "ready_batch", "fraction"):
        assert inspect.signature(pbt.train).parameters[flag].default == given_flags[flag], flag


def summary(differences, make, scale=100, digits=1):
    """("mean ± half-width of the 95% t interval", sign-flip p, mean) of paired differences."""
    mean, half = statistics.mean(differences), make.half_width(differences)
    p = make.sign_flip_p(differences)
    return f"{mean * scale:+.{digits}f} ± {half * scale:.{digits}f}", p, mean


def test_the_batch_sweeps_paired_gains_and_their_verdicts_follow_from_the_json():
    """Linear scaling minus the base lr, paired by seed, at each multiple: quoted with its 95% t
    interval, "outside the noise" exactly where the interval excludes 0."""
    make = script()
    chapter = flat(ROOT / "tutorials" / "09_large_batch_and_search.md")
    stored = json.loads((OUT / "09_batch.json").read_text())["accuracy"]
    gains, outside = {}, []
    for multiple in (2, 4, 8, 16):
        base, scaled = stored[f"{multiple}x|base lr"], stored[f"{multiple}x|linear scaling + 2-epoch warm-up"]
        text, _, mean = summary([b - a for a, b in zip(base, scaled)], make)
        gains[multiple] = text
        if abs(mean) > make.half_width([b - a for a, b in zip(base, scaled)]):
            outside.append(multiple)
    assert outside == [4, 8, 16], outside
    assert (f"linear scaling is {gains[4]} points at 4x, {gains[8]} at 8x and {gains[16]} at 16x, outside the "
            f"noise, and {gains[2]} at 2x") in chapter


def test_the_verdict_and_every_number_quoted_about_it_follow_from_the_json():
    make = script()
    chapter = flat(ROOT / "tutorials" / "09_large_batch_and_search.md")
    confirm, long = results("confirm"), results("confirm_long")
    accuracy, p, mean = summary(paired(confirm), make)
    met = mean > 0 and p < 0.05
    differences = paired(confirm)
    wins, ties = sum(d > 0 for d in differences), sum(d == 0 for d in differences)
    worse = len(differences) - wins - ties
    loss, loss_p, _ = summary(paired(confirm, key="test_loss"), make, scale=1, digits=3)
    evolution, evolution_p, _ = summary(paired(confirm, "evolution"), make)
    expected = [
        f"**Verdict: {'met' if met else 'not met'}.**",
        f"At the first protocol's setting (then the defaults, 6 rounds of 20 x 32) PBT "
        f"{'beats' if met else 'does not beat'} random search of the same budget beyond the noise",
        f"better in {wins} of the {len(differences)} seeds (tied in {ties}, worse in {worse})",
        f"({accuracy} points) and the sign-flip p is {p:.3f}",
        f"the test loss says the same ({loss}, p = {loss_p:.3f})",
        f"Evolution is inside the noise again ({evolution} points, p = {evolution_p:.3f})",
        f"{'met' if met else 'not met'}, {accuracy} points, sign-flip p = {p:.3f}",              # the summary
    ]
    test_rows = len(load_data("digits", 0, None).y_test)
    images = {seed: round(d * test_rows) for seed, d in zip(seeds_of(confirm), differences)}
    ahead = sorted(images, key=lambda seed: -images[seed])[:3]
    behind = sorted((seed for seed in images if images[seed] <= -10), key=lambda seed: seed)
    expected.append(f"PBT is ahead by {', '.join(str(images[s]) for s in ahead[:2])} and {images[ahead[2]]} of the "
                    f"{test_rows} test images at seeds {', '.join(map(str, ahead[:2]))} and {ahead[2]}, and behind by "
                    f"{' and '.join(str(-images[s]) for s in behind)} at seeds {' and '.join(map(str, behind))}")
    for text in expected:
        assert text in chapter, f"chapter 9 should say: {text}"
    # the long budget on the same seeds, reported beside it
    long_accuracy, long_p, _ = summary(paired(long), make)
    long_differences = paired(long)
    long_wins, long_ties = sum(d > 0 for d in long_differences), sum(d == 0 for d in long_differences)
    quoted = (f"{long_accuracy} points (better in {long_wins} of {len(long_differences)} seeds, tied in {long_ties}, "
              f"worse in {len(long_differences) - long_wins - long_ties}; sign-flip p {make.p_value(long_p)})")
    assert quoted in chapter, quoted
    # the exploration's numbers
    for name, budget in [("search_long", "12 x 40"), ("search_short", "6 x 20")]:
        text, explored_p, _ = summary(paired(results(name)), make)
        assert f"| pbt - random, test accuracy | {text} points" in chapter, (name, budget)
        assert f"sign-flip p = {explored_p:.3f}" in chapter, (name, budget)
    # the protocol's power figures
    power = json.loads((OUT / "09_power.json").read_text())
    assert (f"(mean / sd {power['effect']:.2f}), the test below would find it with 16 pairs only "
            f"{power['power']['16'] * 100:.0f}% of the time, with 32 pairs "
            f"{power['power']['32'] * 100:.0f}%") in chapter


def test_the_second_protocols_verdict_and_its_numbers_follow_from_the_json():
    """Seeds 48-79 at the defaults: met only if the mean difference in test accuracy is positive and
    the sign-flip p < 0.025; the chapter, the summary and the answers quote it."""
    make = script()
    chapter = flat(ROOT / "tutorials" / "09_large_batch_and_search.md")
    found = results("reconfirm")
    differences = paired(found)
    accuracy, p, mean = summary(differences, make)
    met = mean > 0 and p < 0.025
    wins, ties = sum(d > 0 for d in differences), sum(d == 0 for d in differences)
    loss, loss_p, _ = summary(paired(found, key="test_loss"), make, scale=1, digits=3)
    loss_wins = sum(d < 0 for d in paired(found, key="test_loss"))
    evolution, evolution_p, _ = summary(paired(found, "evolution"), make)
    evolution_differences = paired(found, "evolution")
    pbt_runs = [found[f"pbt|{seed}"]["final"]["test_accuracy"] for seed in seeds_of(found)]
    random_runs = [found[f"random|{seed}"]["final"]["test_accuracy"] for seed in seeds_of(found)]
    means = (f"{statistics.mean(pbt_runs) * 100:.1f} ± {make.half_width(pbt_runs) * 100:.1f}% against "
             f"{statistics.mean(random_runs) * 100:.1f} ± {make.half_width(random_runs) * 100:.1f}%")
    for text in [f"**Verdict of the second protocol: {'met' if met else 'not met'}.**",
                 f"ahead by {accuracy} points of test accuracy, better in {wins} of the {len(differences)} seeds "
                 f"(tied in {ties}, worse in {len(differences) - wins - ties}), sign-flip p = {p:.3f}",
                 f"the test loss agrees ({loss}, better in {loss_wins} seeds, p {make.p_value(loss_p)})",
                 f"({means})",
                 f"Evolution is also ahead here ({evolution} points, better in "
                 f"{sum(d > 0 for d in evolution_differences)}, tied in {sum(d == 0 for d in evolution_differences)}, "
                 f"p = {evolution_p:.3f})",
                 f"{'met' if met else 'not met'}, {accuracy} points, p = {p:.3f}"]:        # the summary
        assert text in chapter, f"chapter 9 should say: {text}"
    assert f"Evolution is also ahead here ({evolution}" in chapter and f"p = {evolution_p:.3f}), unlike" in chapter


@pytest.mark.skipif(assignments.is_student_tree(ROOT), reason=assignments.STUDENT_TREE)
def test_the_worked_answers_quote_both_protocols_verdicts():
    make = script()
    answers = flat(ROOT / "tutorials" / "assignments" / "answers.md")
    _, first_p, _ = summary(paired(results("confirm")), make)
    assert f"did not separate PBT from random search, p = {first_p:.3f}" in answers
    accuracy, p, _ = summary(paired(results("reconfirm")), make)
    assert f"did: {accuracy} points, p = {p:.3f}" in answers


@settings(max_examples=60)
@given(st.lists(st.one_of(st.integers(-40, 40).map(lambda k: k / 359),
                          st.floats(-3, 3, allow_nan=False, allow_subnormal=False)), min_size=1, max_size=11))
def test_sign_flip_p_by_halves_counts_the_same_flips_as_visiting_all_of_them(differences):
    make = script()
    assert make.sign_flip_p(differences) == make.sign_flip_p_by_enumeration(differences)


def test_sign_flip_p_is_exact_at_32_pairs():
    make = script()
    assert make.sign_flip_p([0.01] * 32) == 2 / 2 ** 32                 # all plus or all minus
    assert make.sign_flip_p([0.0] * 32) == 1.0
    # 17 ones and 15 minus ones: a flip pattern with k minus signs sums to 32 - 2k, so |sum| >= 2 for
    # every k but 16: p = 1 - C(32, 16) / 2^32
    assert make.sign_flip_p([1.0] * 17 + [-1.0] * 15) == 1 - math.comb(32, 16) / 2 ** 32


@pytest.mark.needs("1.1", "1.2", "1.3", "4.1", "9.2", "9.3")
@pytest.mark.timeout(120)
def test_the_quick_mode_of_a_search_part_runs(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--only", "confirm", "--seeds", "7", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads((tmp_path / "09_confirm.json").read_text())
    assert sorted(found) == ["evolution|7", "pbt|7", "random|7"]
    assert all(run["lineage"]["rounds"] == 2 and math.isfinite(run["final"]["test_loss"]) for run in found.values())


def test_pbts_module_header_says_what_pbt_does_not_what_was_measured():
    """The header gives the algorithm, its cost and its run line; the protocols, seeds and verdicts
    are chapter 9's (a module header that keeps a lab notebook goes stale with every new run)."""
    header = ast.get_docstring(ast.parse((ROOT / "algorithms" / "pbt.py").read_text()))
    for mark in ("±", "sign-flip", "p = 0.", "seeds 0-", "protocol"):
        assert mark not in header, f"pbt.py's header quotes results ({mark!r}): they belong in chapter 9"
    assert "tutorials/09_large_batch_and_search.md, section 3" in header
