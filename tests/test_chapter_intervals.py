"""One notation for intervals in every chapter: a ± is the mean ± the half-width of the 95% t
interval over the n seeds, and each chapter that uses ± says so (the per-chapter number tests,
tests/test_chapter*_numbers.py and tests/test_figures_*.py, recompute the quoted values that way).

Checked here, on the prose outside code blocks: a chapter that writes ± names the 95% t interval
at least once, and no chapter writes a standard deviation as ± ("mean ± standard deviation",
"mean +- sd", "± sd") or writes an interval as ASCII "+-" in prose.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.md"))
T_INTERVAL = re.compile(r"95% t[ -]interval|95% t interval|95% interval on the mean", re.I)
STANDARD_DEVIATION_AS_PLUS_MINUS = re.compile(
    r"(?:±|\+-)\s*(?:sample\s+)?(?:standard "
    r"deviation|std\b|sd\b)|mean\s*(?:±|\+-)\s*(?:sample\s+)?(?:standard|sd\b|std\b)",
    re.I)
ASCII_INTERVAL = re.compile(r"\d\s*\+-\s*\d")


def prose(path):
    """The chapter without its fenced code blocks and indented code lines."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_every_plus_minus_is_a_95_percent_t_interval_said_once_per_chapter(chapter):
    text = prose(chapter)
    if "±" in text:
        assert T_INTERVAL.search(text), f"{chapter.name} writes ± but never says it is the 95% t interval"
    assert not STANDARD_DEVIATION_AS_PLUS_MINUS.search(text), \
        f"{chapter.name}: {STANDARD_DEVIATION_AS_PLUS_MINUS.search(text).group(0)!r}: a ± is an interval here"
    found = ASCII_INTERVAL.search(text)
    assert not found, f"{chapter.name}: {found.group(0)!r}: write intervals as ±"
