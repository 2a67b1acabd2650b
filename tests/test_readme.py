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


def test_the_readmes_algorithm_table_and_the_runnable_modules_are_the_same_and_each_shows_its_run_line():
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^\| `algorithms\.([\w.]+)`", readme, re.M)
    runnable = sorted(".".join(path.relative_to(ROOT / "algorithms").with_suffix("").parts)
                      for path in (ROOT / "algorithms").rglob("*.py")
                      if re.search(r"^def main\(", path.read_text(), re.M))
    assert sorted(listed + ["core.evaluate"]) == runnable, "README's table and algorithms/ disagree"
    assert "python -m algorithms.core.evaluate" in readme
    for name in runnable:                          # each header opens with the command that runs it
        module = importlib.import_module(f"algorithms.{name}")
        assert callable(module.main) and f"-m algorithms.{name}" in module.__doc__.split("\n\n")[1], name
