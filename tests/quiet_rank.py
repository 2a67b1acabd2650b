"""pytest plugin loaded by tests/run.py on ranks 1..p-1 only: they print no report.

Rank 0 prints the report. Tests check with ``parallel_assert``, which fails on every rank at
once, so rank 0's report already names the ranks where a check failed. Errors still reach stderr.
"""
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        config.pluginmanager.unregister(reporter)
