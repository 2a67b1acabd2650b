"""The README's commands are the ones CI runs, and its tables name modules that exist."""
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands():
    return re.findall(r"^```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S | re.M)


def test_ci_runs_the_readme_test_command_verbatim():
    test_command = readme_commands()[1]
    assert "tests/run.py" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_every_algorithm_module_in_the_readme_imports():
    names = re.findall(r"^\| `(algorithms\.\w+)`", (ROOT / "README.md").read_text(), re.M)
    assert names
    for name in names:
        importlib.import_module(name)
