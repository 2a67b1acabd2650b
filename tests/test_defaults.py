"""Defaults are written once: each algorithm's ``DEFAULTS`` is what both ``train`` (``Settings.of``) and
``--help`` (``cli.parser``) use, the family's own are ``run.Settings``'s on both sides, and a header's
run line shows no value other than the one ``--help`` would.
"""
import ast
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

from algorithms.core import cli
from algorithms.core.run import Settings
from tests.test_flags import parser_of

ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = sorted(path.stem for path in (ROOT / "algorithms").glob("*.py")
                    if re.search(r"^def train\(", path.read_text(), re.M))
# the algorithms whose shared settings are not fixed defaults, and why
COMPUTED = {"pbt": "each member draws its lr, momentum and batch; its epochs are --rounds"}
FIELDS = {field.name for field in dataclasses.fields(Settings)}


def test_the_parsers_family_defaults_are_the_settings():
    signature = inspect.signature(cli.parser).parameters
    for name in ("epochs", "lr", "batch_size", "model", "momentum", "check_every"):
        assert signature[name].default == getattr(Settings(), name), name


def declared_defaults(path):
    """The module's top-level ``DEFAULTS`` as a literal dict (``dict(a=1)`` or ``{"a": 1}``), or None."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DEFAULTS" for t in node.targets):
            if isinstance(node.value, ast.Call):
                return {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.value.keywords}
            return ast.literal_eval(node.value)
    return None


def defaults_problems(path):
    """What breaks the rule in algorithm module ``path`` (an empty list: none)."""
    text, name = path.read_text(), path.stem
    defaults = declared_defaults(path)
    if defaults is None:
        return [] if name in COMPUTED else [f"{name}: no DEFAULTS (the shared flags' defaults, written once)"]
    tables = list(defaults.values()) if all(isinstance(value, dict) for value in defaults.values()) else [defaults]
    problems = [f"{name}: DEFAULTS names {key}, not a shared setting" for table in tables for key in table
                if key not in FIELDS]
    if len(tables) == 1:                          # by problem (hogwild): its own lookup, shown in --help's epilog
        for call in ("Settings.of(", "cli.parser("):
            start = text.find(call)
            if start < 0 or "**DEFAULTS" not in text[start:text.find("\n", text.find(")", start))]:
                problems.append(f"{name}: {call}...) does not take **DEFAULTS")
    return problems


@pytest.mark.parametrize("name", ALGORITHMS)
def test_each_algorithm_writes_its_defaults_once_and_help_shows_what_train_uses(name):
    path = ROOT / "algorithms" / f"{name}.py"
    assert not defaults_problems(path)
    defaults = declared_defaults(path)
    if defaults is None or any(isinstance(value, dict) for value in defaults.values()):
        return
    settings = Settings.of({}, **defaults)
    parser = parser_of(importlib.import_module(f"algorithms.{name}"))
    differ = {action.dest: (action.default, getattr(settings, action.dest)) for action in parser._actions
              if action.dest in FIELDS and action.default is not None
              and action.default != getattr(settings, action.dest)}
    assert not differ, f"{name}: --help's default, train's: {differ}"


def run_line_values(path):
    """{flag: value} shown as ``[--flag value]`` in the header's command lines (placeholders left out)."""
    header = ast.get_docstring(ast.parse(path.read_text())) or ""
    lines = [line.strip() for line in header.splitlines() if re.match(r"\s*(mpiexec|python) ", line)]
    return {flag: value for line in lines for flag, value in re.findall(r"\[(--[\w-]+) ([^\]\s|]+)\]", line)
            if not value.isupper() and not value.endswith((".json", ".png", ".jsonl", ".npz"))}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_header_shows_no_default_other_than_helps(name):
    parser = parser_of(importlib.import_module(f"algorithms.{name}"))
    defaults = {action.option_strings[-1]: action.default for action in parser._actions if action.option_strings}
    shown = run_line_values(ROOT / "algorithms" / f"{name}.py")
    wrong = {flag: (value, defaults.get(flag)) for flag, value in shown.items()   # None, SUPPRESS: found at run time
             if flag not in defaults or (defaults[flag] not in (None, "==SUPPRESS==") and str(defaults[flag]) != value)}
    assert not wrong, f"{name}: the header's run line shows (value, --help's default): {wrong}"


def test_a_module_writing_its_defaults_twice_or_showing_another_is_seen(tmp_path):
    module = tmp_path / "toy.py"
    module.write_text('"""Toy.\n\n    mpiexec -n 2 python -m algorithms.toy [--epochs 5] [--lr X]\n"""\n'
                      "DEFAULTS = dict(epochs=3, widgets=2)\n\n\ndef train(comm=None, **settings):\n"
                      "    settings = Settings.of(settings, epochs=3)\n\n\ndef main(argv=None):\n"
                      "    cli.parser(doc, **DEFAULTS)\n")
    assert defaults_problems(module) == ["toy: DEFAULTS names widgets, not a shared setting",
                                         "toy: Settings.of(...) does not take **DEFAULTS"]
    assert run_line_values(module) == {"--epochs": "5"}
