"""MPI tags: algorithms/ and collectives/ each keep one registry, and no two uses share a tag.

A tag shared by two roles lets a receive of one take the other's message when a fast rank runs
ahead; the registries' ranges must therefore be disjoint and below 32767 (the largest tag every
MPI must allow), and no module outside them may write a tag as a number.
"""
import ast
from pathlib import Path

from algorithms.core import tags as algorithm_tags
from collectives import tags as collective_tags

ROOT = Path(__file__).resolve().parent.parent


def ranges():
    found = dict(algorithm_tags.RANGES)
    found.update({f"collectives {name}": (value, 1) for name, value in vars(collective_tags).items()
                  if name.isupper() and isinstance(value, int)})
    return found


def test_the_registries_ranges_are_disjoint_and_below_mpis_guaranteed_bound():
    spans = sorted((first, first + count - 1, name) for name, (first, count) in ranges().items())
    overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if b[0] <= a[1]]
    assert not overlaps, f"tag ranges overlap: {overlaps}"
    assert spans[0][0] > 0 and spans[-1][1] <= 32767, spans


def literal_tags(path):
    """(line, value) of every tag= / sendtag= / recvtag= keyword given a number literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.keyword) and node.arg in ("tag", "sendtag", "recvtag") \
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
            found.append((node.lineno, node.value.value))
    return found


def test_no_module_sends_with_a_tag_written_as_a_number():
    literal = {str(path.relative_to(ROOT)): literal_tags(path)
               for package in ("algorithms", "collectives") for path in sorted((ROOT / package).rglob("*.py"))
               if path.name != "tags.py" and literal_tags(path)}
    assert not literal, f"tags outside the registries: {literal}"
