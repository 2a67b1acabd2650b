"""collectives' section of the user's tuning file: the calibration and auto's selection measured on this machine.

minidl's ``python -m minidl.tune`` (or ``mpiexec -n 2 python -m collectives.bench --calibrate
--write-selection``) writes one JSON file per user, read here when collectives is imported:

    where     $MINIDL_TUNING if set ("none": no file; a file it names that is not there: a note),
              else $XDG_CONFIG_HOME/minidl/tuning.json, else ~/.config/minidl/tuning.json
    file      {"format": "minidl tuning", "version": 1, "minidl": {...}, "collectives": {...}}
    section   {"machine": {...}, "calibration": {calibration.py's JSON}, "selection": {"p": [[from_bytes,
              algorithm], ...]}}

minidl reads its own section with its own reader (``minidl/tuning.py``): the packages share the file's
format, never an import. The section is keyed to the machine (``machine()``: CPU model, cores,
the MPI library, NumPy): one written elsewhere, or before an upgrade of MPI or NumPy, is refused,
with a note on rank 0's stderr, and the shipped files are used (``model/calibration.json``,
``selection.json``). A section that is not one (bad JSON, values of the wrong kind): the same note
at import, and ``current()`` raises ValueError naming the file (the bench and the training set-up
stop with ``error: ...``).
"""
import json
import os
import sys
from pathlib import Path

import numpy
from mpi4py import MPI

from .cost import ALGORITHMS

SECTION, FORMAT, VERSION = "collectives", "minidl tuning", 1


def location():
    """The tuning file's path, or None where MINIDL_TUNING=none."""
    chosen = os.environ.get("MINIDL_TUNING", "").strip()
    if chosen.lower() == "none":
        return None
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.expanduser("~/.config")
    return Path(chosen).expanduser() if chosen else Path(config, "minidl", "tuning.json")


def machine():
    """What the section's measurements depend on: the processor, how many cores, MPI and NumPy."""
    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as info:
            model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    return {"cpu": model, "cores": os.cpu_count(), "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "numpy": numpy.__version__}


def whole_file(path):
    """The tuning file as a dict ({} if there is none); ValueError naming it if it is not one."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"tuning file {path}: not readable JSON ({error})") from None
    if not isinstance(data, dict) or (data.get("format"), data.get("version")) != (FORMAT, VERSION):
        raise ValueError(f"tuning file {path}: not a minidl tuning file of version {VERSION}")
    return data


def selection_from(rows_by_p, where, known=ALGORITHMS):
    """{p: ((from_bytes, algorithm), ...)} from the section's "selection"; ValueError naming ``where``."""
    if not isinstance(rows_by_p, dict):
        raise ValueError(f"{where}: 'selection' must map p to [[from_bytes, algorithm], ...]")
    selection = {}
    for p, rows in rows_by_p.items():
        if (not p.isdigit() or not isinstance(rows, list) or not rows
                or any(not isinstance(row, list) or len(row) != 2 or isinstance(row[0], bool)
                       or not isinstance(row[0], int) or row[0] < 0 or row[1] not in known for row in rows)):
            raise ValueError(f"{where}: selection[{p!r}] must be [[from_bytes >= 0, one of {', '.join(known)}], "
                             f"...], got {rows!r}")
        selection[int(p)] = tuple(sorted((nbytes, name) for nbytes, name in rows))
    return selection


def load(path, here=None):
    """(section or None, note or None): the section where it was measured on this machine; a note saying
    why not where it was not. ValueError for a file or section that is not one."""
    if path is None:
        return None, None
    section = whole_file(path).get(SECTION)
    if section is None:
        return None, None
    where = f"tuning file {path}, section {SECTION}"
    if not isinstance(section, dict) or not isinstance(section.get("machine"), dict):
        raise ValueError(f"{where}: no \"machine\" object")
    selection_from(section.get("selection", {}), where)
    here = machine() if here is None else here
    written = section["machine"]
    changed = [f"{key} {here.get(key)!r} here, {written.get(key)!r} in the file"
               for key in sorted(set(here) | set(written)) if here.get(key) != written.get(key)]
    if changed:
        return None, (f"collectives: note: refused the tuning in {path}, measured on another machine or MPI "
                      f"({'; '.join(changed)}); using the shipped calibration and selection")
    return section, None


def loaded_at_import():
    """(section or None, error or None), a note printed on rank 0 where the section is refused or bad."""
    try:
        section, note = load(location())
        error = None
        if location() is not None and not location().exists() and os.environ.get("MINIDL_TUNING", "").strip():
            note = (f"collectives: note: MINIDL_TUNING names {location()}: no such file; using the shipped "
                    "calibration and selection")
    except ValueError as problem:
        section, error = None, problem
        note = f"collectives: note: {problem}; using the shipped calibration and selection"
    if note and MPI.COMM_WORLD.Get_rank() == 0:
        print(note, file=sys.stderr)
    return section, error


ACTIVE, ERROR = loaded_at_import()


def current():
    """This machine's section (None: none written, or refused); ValueError if the file is no tuning file."""
    if ERROR is not None:
        raise ERROR
    return ACTIVE


def selection():
    """{p: ((from_bytes, algorithm), ...)} of this machine's section ({} where there is none)."""
    return selection_from(ACTIVE.get("selection", {}), "tuning") if ACTIVE else {}


def store(path, key, value):
    """Write ``value`` as the section's ``key`` ("calibration" or "selection"), the file's other sections
    and keys kept, this machine's key beside it; written beside the file and renamed."""
    data = whole_file(path)
    section = data.get(SECTION)
    if not isinstance(section, dict) or section.get("machine") != machine():
        section = {}                                     # another machine's measurements: not mixed with these
    section.update({key: value, "machine": machine()})
    data.update(format=FORMAT, version=VERSION, **{SECTION: section})
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, path)
