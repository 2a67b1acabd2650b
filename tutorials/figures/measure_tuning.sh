#!/usr/bin/env bash
# The acceptance sequence of "Fast on the machine it runs on" (minidl.tune, interleaved benchmarks), run as
# a new user would on a machine that never tuned:
#   1. python -m minidl.tune                         (wall time; target <= 5 min)
#   2. python -m minidl.bench sweep --launches 3     (every target met by the median in >= 2 of 3 launches)
#   3. python -m algorithms.bench --ranks 2          (every row <= 0.9x DDP)
# JSON outputs and logs go to /tmp/minidl-tuning-check/ (OUT=... to change); a summary table is printed at the end.
#
#   bash tutorials/figures/measure_tuning.sh [REPO]     # REPO: the checkout to measure (default: the current folder)
#   PYTHON=/path/to/python bash ...          # default: REPO/.venv/bin/python, else python3
#
# The tuning file: MINIDL_TUNING if set, else OUT/tuning.json (removed first: "a machine that never tuned").
# To use the real user location (~/.config/minidl/tuning.json) set MINIDL_TUNING=~/.config/minidl/tuning.json
# yourself; the default keeps a shared machine's other users off this run's tuning.
set -euo pipefail
REPO=$(cd "${1:-.}" && pwd)
OUT=${OUT:-/tmp/minidl-tuning-check}
PYTHON=${PYTHON:-$([ -x "$REPO/.venv/bin/python" ] && echo "$REPO/.venv/bin/python" || command -v python3)}
export MINIDL_TUNING=${MINIDL_TUNING:-$OUT/tuning.json}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
export PATH="$(dirname "$PYTHON"):$PATH"          # mpiexec beside the interpreter (the mpich wheel)
mkdir -p "$OUT"
rm -f "$MINIDL_TUNING" "$OUT"/sweep.json "$OUT"/ddp.json
cd "$REPO"
"$PYTHON" -c "import torch" 2>/dev/null || echo "WARNING: no torch in $PYTHON: the PyTorch and DDP columns stay empty"

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "repo $REPO ($(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')), python $PYTHON, tuning file $MINIDL_TUNING"
echo "load before: $(load)" | tee "$OUT/load.txt"

t0=$(date +%s.%N)
# /usr/bin/time (where present) adds the tuner's CPU time, its children's included: on a loaded machine
# the wall time says more about the neighbours than about the tuner
TIMER=(); [ -x /usr/bin/time ] && TIMER=(/usr/bin/time -o "$OUT/tune.time" -f "%e %U %S")
rm -f "$OUT/tune.time"
${TIMER[@]+"${TIMER[@]}"} "$PYTHON" -m minidl.tune 2>&1 | tee "$OUT/tune.log"
t1=$(date +%s.%N)
echo "load after tune: $(load)" | tee -a "$OUT/load.txt"
"$PYTHON" -m minidl.bench sweep --launches 3 --json "$OUT/sweep.json" 2>&1 | tee "$OUT/sweep.log"
t2=$(date +%s.%N)
echo "load after sweep: $(load)" | tee -a "$OUT/load.txt"
"$PYTHON" -m algorithms.bench --ranks 2 --json "$OUT/ddp.json" 2>&1 | tee "$OUT/ddp.log"
t3=$(date +%s.%N)
echo "load after algorithms.bench: $(load)" | tee -a "$OUT/load.txt"

"$PYTHON" - "$OUT" "$t0" "$t1" "$t2" "$t3" <<'EOF'
import json, sys
from pathlib import Path
out, t0, t1, t2, t3 = Path(sys.argv[1]), *map(float, sys.argv[2:])
print(f"\n== summary ({out}) ==")
print(f"minidl.tune: {t1 - t0:.0f} s wall (target <= 300 s: {'met' if t1 - t0 <= 300 else 'NO'}); "
      f"sweep {t2 - t1:.0f} s; algorithms.bench {t3 - t2:.0f} s")
if (out / "tune.time").exists():
    wall, user, system = map(float, (out / "tune.time").read_text().split()[-3:])
    print(f"minidl.tune CPU time (its processes and their children): {user + system:.0f} s "
          f"(user {user:.0f}, sys {system:.0f}) in {wall:.0f} s wall")
print((out / "load.txt").read_text().strip())
*rows, summary = json.loads((out / "sweep.json").read_text())
launches = summary["launches"]
print(f"\nsweep: {launches} launches; {summary['machine']['tuning']}")
print(f"{'case':<31} {'batch':>5}  {'target':<15} " + "  ".join(f"{'launch ' + str(k + 1):<22}" for k in range(launches))
      + "  met in")
cases = dict.fromkeys((r["case"], r["batch"]) for r in rows if r.get("met") is not None and r["device"] == "cpu")
every = True
for case, batch in cases:
    cells, met = [], 0
    for k in range(launches):
        row = next(r for r in rows if (r["case"], r["batch"], r["launch"]) == (case, batch, k) and r["device"] == "cpu")
        key, spread = ("median_over_floor", "over_floor_range") if "median_over_floor" in row else (
            "median_ratio", "ratio_range")
        low, high = row[spread]
        cells.append(f"{row[key]:.2f} [{low:.2f}, {high:.2f}] {'ok' if row['met'] else 'NO'}")
        met += bool(row["met"])
    every &= 3 * met >= 2 * launches                        # at least 2 of 3
    print(f"{case:<31} {batch:>5}  {row['target']:<15} " + "  ".join(f"{c:<22}" for c in cells) + f"  {met} of {launches}")
print(f"sweep acceptance (every target met by the median in >= 2 of 3 launches): {'met' if every else 'NO'}")
ddp = json.loads((out / "ddp.json").read_text())
print(f"\nalgorithms.bench --ranks 2 (median of {ddp[0]['runs']} runs, [min, max]):")
print(f"{'model':<7} {'batch':>5} {'ring ms':>8} {'mpi ms':>8} {'DDP ms':>8}  {'ring / DDP':<20} {'mpi / DDP':<20} met")
for r in ddp:
    def ratio(side):
        value, spread = r[f"{side}_ratio"], r[f"{side}_ratio_range"]
        return "-" if value is None else f"{value:.2f} [{spread[0]:.2f}, {spread[1]:.2f}]"
    print(f"{r['model']:<7} {r['batch']:>5} {r['ring_ms'] or 0:8.2f} {r['mpi_ms'] or 0:8.2f} {r['ddp_ms'] or 0:8.2f}  "
          f"{ratio('ring'):<20} {ratio('mpi'):<20} {'-' if r['met'] is None else ('yes' if r['met'] else 'NO')}")
print(f"algorithms.bench acceptance (every row <= 0.9x DDP): "
      f"{'met' if all(r['met'] for r in ddp) else 'NO'}")
EOF
