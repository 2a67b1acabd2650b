"""The tuning file: the choices that decide speed, measured on this machine (``python -m minidl.tune``).

Like FFTW's wisdom and cuDNN's benchmark mode, minidl measures what is fastest where it runs instead
of trusting constants chosen on another machine. ``python -m minidl.tune`` times the candidates and
writes one JSON file per user; minidl reads its own section of it when it is first imported:

    path      $MINIDL_TUNING if set ("none": no file, the shipped defaults; a file it names that is
              not there: a note, the shipped defaults), else $XDG_CONFIG_HOME/minidl/tuning.json,
              else ~/.config/minidl/tuning.json (none there: a machine that never tuned)
    format    {"format": "minidl tuning", "version": 1, "minidl": {...}, "collectives": {...}}
    minidl    {"machine": {...}, "written": date, "settings": {...}, "measurements": {...}}

The file is shared with ``collectives`` (its allreduce selection and calibration), which reads its own
section with a reader of its own: neither package imports the other, only the file's format is common.

minidl's settings (each one the shipped default where the file does not say):

    block_bytes            the im2col kernel's block of images (``im2col_blocked.image_blocks``;
                           default twice the L2 cache)
    column_bytes           the column budget (``budget.py``; MINIDL_CONV_COLUMN_BYTES and
                           ``set_column_budget`` still win over the file)
    layouts                per conv shape, [[from_batch, layout], ...]: where the kernel keeps its
                           columns ("batch inner", "per image", "im2col order") or keeps none ("blocks")
                           (``im2col_blocked.kept_layout``; a shape not listed takes the rule there)
    winograd_min_channels  ``auto``'s thresholds (``conv/auto.py``)
    fft_min_kernel

Every one of them can change the last bits of a result (another block size or layout sums in another
order; another threshold picks another algorithm): same seed and same settings, same bits, and the
file is where the settings are written down.

The file is keyed to the machine (``machine()``: CPU model, core count, L2 cache, the BLAS kernel
OpenBLAS picked, NumPy's version). A section written for another machine or another NumPy is refused
with a one-line note on stderr and the shipped defaults are used; a file that is not a tuning file
(unreadable, not JSON, values of the wrong kind) is an error: ``current()`` raises ValueError naming
the file, which the programs turn into ``error: ...`` and exit status 2.
"""
import datetime
import json
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

ENVIRONMENT = "MINIDL_TUNING"
FORMAT, VERSION = "minidl tuning", 1
LAYOUTS = ("batch inner", "per image", "im2col order", "blocks")


def path():
    """Where the tuning file is (a Path), or None where MINIDL_TUNING=none."""
    chosen = os.environ.get(ENVIRONMENT, "").strip()
    if chosen.lower() == "none":
        return None
    if chosen:
        return Path(chosen).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "minidl" / "tuning.json"


def l2_bytes():
    """The per-core L2 cache in bytes, 0 where the system does not say: Linux's sysfs (cpu0's cache of
    level 2), else sysconf. (Python's os.sysconf knows no SC_LEVEL2_CACHE_SIZE on Linux: asked alone,
    it raised, and every machine got the 1 MiB fallback.)"""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                size = (index / "size").read_text().strip().upper()
                scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
                return int(size.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    try:
        size = os.sysconf("SC_LEVEL2_CACHE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    return size if size and size > 0 else 0


def cpu_model():
    """The CPU's model name (/proc/cpuinfo on Linux, else what platform says)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def blas_core():
    """The kernel OpenBLAS chose for this processor (``openblas_get_corename``, under whichever prefix
    NumPy's copy of OpenBLAS exports it), or None where NumPy's BLAS is not OpenBLAS."""
    import ctypes

    import numpy  # noqa: F401  (loads NumPy's BLAS, so that it is among the mapped files below)
    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for library in sorted(libraries):
        try:
            loaded = ctypes.CDLL(library)
        except OSError:
            continue
        for name in ("openblas_get_corename", "openblas_get_corename64_", "scipy_openblas_get_corename64_",
                     "scipy_openblas_get_corename"):
            function = getattr(loaded, name, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return None


def machine():
    """What the settings were measured on: a section written for other values is refused."""
    import numpy
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "l2_bytes": l2_bytes(), "blas_core": blas_core(),
            "numpy": numpy.__version__}


@dataclass(frozen=True)
class Settings:
    """The settings in force; the defaults are the shipped ones, what a machine that never tuned runs."""
    block_bytes: int = 2 * (l2_bytes() or 1 << 20)        # twice the L2 cache (1 MiB where unknown)
    column_bytes: int = 64 << 20
    layouts: dict = field(default_factory=dict)           # none: im2col_blocked.kept_layout's rule
    winograd_min_channels: int = 256
    fft_min_kernel: int = 7
    source: str = "the shipped defaults"


SHIPPED = Settings()


def layout_for(layouts, key, batch):
    """The layout ``layouts`` names for shape ``key`` at this batch: the row with the largest from_batch
    <= batch (below the smallest one measured, that one's); None where the shape is not listed."""
    rows = layouts.get(key)
    if not rows:
        return None
    chosen = rows[0][1]
    for start, name in rows:
        if batch >= start:
            chosen = name
    return chosen


def shape_key(x_shape, weight_shape, stride, padding, itemsize):
    """The layouts table's key for a conv shape (the batch left out): "C,H,W>F,kh,kw/s,p/itemsize"."""
    _, c, h, w = x_shape
    f, _, kh, kw = weight_shape
    return f"{c},{h},{w}>{f},{kh},{kw}/{stride},{padding}/{itemsize}"


def _whole(section, key, low, where):
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: {key!r} must be a whole number >= {low}, got {value!r}")
    return value


def _layouts(value, where):
    if not isinstance(value, dict):
        raise ValueError(f"{where}: 'layouts' must map conv shapes to [[from_batch, layout], ...], got {value!r}")
    for key, rows in value.items():
        if (not isinstance(rows, list) or not rows
                or any(not isinstance(row, list) or len(row) != 2 or isinstance(row[0], bool)
                       or not isinstance(row[0], int) or row[0] < 1 or row[1] not in LAYOUTS for row in rows)):
            raise ValueError(f"{where}: layouts[{key!r}] must be [[from_batch >= 1, one of {', '.join(LAYOUTS)}], "
                             f"...], got {rows!r}")
    return {key: [list(row) for row in sorted(rows)] for key, rows in value.items()}


def read(file):
    """The whole tuning file as a dict ({} where it does not exist); ValueError, naming the file, for one
    that is not a tuning file."""
    file = Path(file)
    if not file.exists():
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"tuning file {file}: not readable JSON ({error}); run python -m minidl.tune again "
                         f"or set {ENVIRONMENT}=none") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"tuning file {file}: not a minidl tuning file of version {VERSION} (no \"format\": "
                         f"\"{FORMAT}\", \"version\": {VERSION}); run python -m minidl.tune again")
    return data


def settings_from(section, where):
    """Settings from a section's "settings" object; ValueError naming ``where`` if it is not one."""
    given = section.get("settings")
    if not isinstance(given, dict):
        raise ValueError(f"{where}: no \"settings\" object")
    return Settings(block_bytes=_whole(given, "block_bytes", 1, where),
                    column_bytes=_whole(given, "column_bytes", 0, where),
                    layouts=_layouts(given.get("layouts", {}), where),
                    winograd_min_channels=_whole(given, "winograd_min_channels", 1, where),
                    fft_min_kernel=_whole(given, "fft_min_kernel", 1, where))


def differences(written, here):
    """"cpu 'A' here, 'B' in the file; ..." for the machine keys that differ ('' if none)."""
    return "; ".join(f"{key} {here.get(key)!r} here, {written.get(key)!r} in the file"
                     for key in sorted(set(written) | set(here)) if written.get(key) != here.get(key))


def load(file=None, here=None):
    """(Settings, note): the file's settings where they were measured on this machine, else the shipped
    defaults and a note saying why (None when there is nothing to say). ValueError for a bad file."""
    named = file is None and os.environ.get(ENVIRONMENT, "").strip()          # by the user, not the default place
    file = path() if file is None else file
    if file is None:
        return SHIPPED, None
    if named and not Path(file).exists():                                      # named and not there: a typo?
        return (replace(SHIPPED, source=f"the shipped defaults ({ENVIRONMENT} names {file}: no such file)"),
                f"minidl: note: {ENVIRONMENT} names {file}: no such file; using the shipped defaults")
    data = read(file)
    section = data.get("minidl")
    if section is None:
        return replace(SHIPPED, source=f"the shipped defaults (no minidl settings in {file})"), None
    where = f"tuning file {file}, section minidl"
    if not isinstance(section, dict) or not isinstance(section.get("machine"), dict):
        raise ValueError(f"{where}: no \"machine\" object")
    tuned = settings_from(section, where)
    mismatch = differences(section["machine"], machine() if here is None else here)
    if mismatch:
        note = (f"minidl: note: refused the tuning in {file}, measured on another machine or NumPy ({mismatch}); "
                "using the shipped defaults (python -m minidl.tune tunes this one)")
        return replace(SHIPPED, source=f"the shipped defaults ({file} refused: {mismatch})"), note
    return replace(tuned, source=f"tuned: {file} (written {section.get('written', '?')})"), None


def _load_at_import():
    try:
        tuned, note = load()
    except ValueError as error:
        return SHIPPED, error
    if note:
        print(note, file=sys.stderr)
    return tuned, None


ACTIVE, ERROR = _load_at_import()


def current():
    """The settings in force; ValueError (naming the file) if the tuning file is not one."""
    if ERROR is not None:
        raise ERROR
    return ACTIVE


def write_section(file, name, section):
    """Store ``section`` as the file's ``name`` section (the other sections kept), written beside it
    and renamed, so that a reader never sees half a file."""
    file = Path(file)
    try:
        data = read(file)
    except ValueError:
        data = {}                            # not a tuning file: replaced by one
    data.update(format=FORMAT, version=VERSION)
    data[name] = dict(section, written=datetime.datetime.now().isoformat(timespec="seconds"))
    file.parent.mkdir(parents=True, exist_ok=True)
    partial = file.with_name(file.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(partial, file)
