"""collectives.bench's rows: each figure the median over interleaved rounds, its [min, max] beside it.

Every round times every row once (``measure.main``'s table_round), MPI's Allreduce among them, so a
row's ratio to MPI is taken round by round (this round's time over MPI's in the same round) and the
median of those ratios is the row's figure, with the smallest and largest round beside it: how far
one round's luck could move it. The model columns likewise: predicted / this round's time, median
and range. The targets are judged on the medians (``flags.target``).
"""
import os
import statistics

from .. import auto
from ..cli import human
from ..model import cost
from .flags import target


def spread(values):
    """(median, [min, max])."""
    return statistics.median(values), [min(values), max(values)]


def model_name(name, nbytes, p):
    """The algorithm whose cost model prices row ``name``: MPI's own rows get the lower bound, auto's the
    algorithm its table picks at this size."""
    if name in ("mpi", "mpi_init"):
        return "lower bound"
    return auto.choose_name(nbytes, p) if name in ("auto", "auto_init") else name


def record(name, p, nbytes, times, rates, fits, calibrated_model):
    """The JSON record of one row: times {row name: [seconds of each round]} of this size; rates the refined
    model's at this size; fits (alpha, beta, gamma); calibrated_model a Calibration or None."""
    alpha, beta, gamma = fits
    modelled = model_name(name, nbytes, p)
    reference = "mpi_init" if name == "auto_init" and "mpi_init" in times else "mpi"   # persistent against persistent
    seconds, seconds_range = spread(times[name])
    ratio, ratio_range = spread([mine / theirs for mine, theirs in zip(times[name], times[reference])])
    model = cost.predict(modelled, p, nbytes, alpha, beta, gamma)
    refined = cost.predict_refined(modelled, p, nbytes, rates) if modelled != "lower bound" else None
    calibrated = (cost.predict_calibrated(modelled, p, nbytes, calibrated_model)
                  if calibrated_model and modelled != "lower bound" else None)
    refined_ratio, refined_range = (None, None) if refined is None else spread([refined / t for t in times[name]])
    calibrated_ratio, calibrated_range = ((None, None) if calibrated is None else
                                          spread([calibrated / t for t in times[name]]))
    goal, met = target(name, nbytes, ratio, refined_ratio,
                       calibrated_ratio if calibrated_model and calibrated_model.p == p else None)
    return {"algorithm": name, "p": p, "bytes": nbytes, "rounds": len(times[name]),
            "seconds": seconds, "seconds_range": seconds_range, "mpi_seconds": statistics.median(times[reference]),
            "ratio": ratio, "ratio_range": ratio_range, "model_seconds": model, "model": modelled,
            "alpha": alpha, "beta": beta, "gamma": gamma,
            "refined_seconds": refined, "refined_ratio": refined_ratio, "refined_ratio_range": refined_range,
            "calibrated_seconds": calibrated, "calibrated_ratio": calibrated_ratio,
            "calibrated_ratio_range": calibrated_range, "load_average": os.getloadavg()[0],
            "rates": {"alpha": alpha, "beta_x": rates.beta_x, "beta_1": rates.beta_1, "beta_solo": rates.beta_solo,
                      "beta_ring": rates.beta_ring, "beta_gather": rates.beta_gather,
                      "beta_scatter": rates.beta_scatter, "gamma_m": rates.gamma_m, "gamma_3": rates.gamma_3,
                      "copy": rates.copy, "share": rates.share},
            "target": goal, "met": met}


HEADER = (f"{'bytes':>9} {'algorithm':<18} {'measured us':>12} {'x MPI [min, max]':>18} {'model us':>10} "
          f"{'model/meas':>10} {'refined us':>10} {'ref/meas':>8} {'cal us':>10} {'cal/meas [min, max]':>20}  "
          f"{'target':<27} met")


def _range(value, low_high):
    return "-" if value is None else f"{value:.2f} [{low_high[0]:.2f}, {low_high[1]:.2f}]"


def line(row):
    """The printed row (medians, and the ratio's rounds [min, max])."""
    label = f"{row['algorithm']}({row['model']})" if row["algorithm"] in ("auto", "auto_init") else row["algorithm"]
    refined, calibrated = row["refined_seconds"], row["calibrated_seconds"]
    met = "-" if row["met"] is None else "met" if row["met"] else "NO"
    return (f"{human(row['bytes']):>9} {label:<18} {row['seconds'] * 1e6:12.1f} "
            f"{_range(row['ratio'], row['ratio_range']):>18} {row['model_seconds'] * 1e6:10.1f} "
            f"{row['model_seconds'] / row['seconds']:10.2f} "
            f"{'-' if refined is None else f'{refined * 1e6:.1f}':>10} "
            f"{'-' if refined is None else format(row['refined_ratio'], '.2f'):>8} "
            f"{'-' if calibrated is None else f'{calibrated * 1e6:.1f}':>10} "
            f"{_range(row['calibrated_ratio'], row['calibrated_ratio_range']):>20}  {row['target']:<27} {met}")
