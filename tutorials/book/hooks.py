"""MkDocs hooks of the book: equations become MathML, and the API pages' citations link the bibliography.

Equations: pymdownx.arithmatex (generic mode) leaves ``$...$`` as ``<span class="arithmatex">\\(...\\)</span>``
and ``$$...$$`` as ``<div class="arithmatex">\\[...\\]</div>``; each becomes ``<math>`` here, which browsers
draw themselves (MathML Core), from disk, with no network and no JavaScript. An equation that
latex2mathml cannot read stops the build, naming the page.

Citations: the chapters link each work they cite (``references.md#dean2012``); the docstrings name
it by author and year ("Dean et al. 2012", "Ben-Nun & Hoefler (ACM CSUR 2019)"). On the API pages,
a first author's name (from an entry's key in references.md: Dean2012, BenNun2019) followed within
60 characters by that entry's year becomes a link to the entry, outside code and outside links.
"""
import html
import re
from pathlib import Path

from latex2mathml.converter import convert

MATH = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.S)
KEY = re.compile(r"^### \[([A-Za-z]+)(\d{4})\]", re.M)       # an entry of references.md: name and year
TAG = re.compile(r"(<[^>]+>)")
VERBATIM = {"code", "pre", "a", "script", "style"}           # text inside these keeps its words


def on_page_content(content, page, config, **kwargs):
    def mathml(match):
        tag, latex = match.group(1), html.unescape(match.group(2)).strip()
        try:
            return convert(latex, display="block" if tag == "div" else "inline")
        except Exception as error:            # latex2mathml raises several kinds; any one is a bad equation
            raise ValueError(f"{page.file.src_path}: equation {latex!r} does not convert: {error}") from None
    content = MATH.sub(mathml, content)
    if page.file.src_path.startswith("api/"):
        content = link_citations(content, Path(config["docs_dir"]) / "references.md", "../references.html")
    return content


def citations(references):
    """[(pattern, anchor)]: 'Ben-Nun' ... '2019' -> 'bennun2019', one per entry of ``references`` with a year."""
    found = []
    for name, year in KEY.findall(references.read_text()):
        words = re.findall(r"[A-Z][a-z]*", name)                  # BenNun -> Ben, Nun: 'Ben-Nun', 'Ben Nun', 'BenNun'
        pattern = re.compile(r"\b" + "[- ]?".join(words) + r"\b[^<>]{0,60}?\b" + year + r"\b")
        found.append((pattern, f"{name.lower()}{year}"))
    return found


def link_citations(content, references, target):
    """``content`` (HTML) with each citation in its text, outside code and links, a link to its entry."""
    patterns = citations(references)
    pieces, inside = TAG.split(content), []
    for number, piece in enumerate(pieces):
        if number % 2:                                            # a tag: track code, pre and links
            name = re.match(r"</?\s*(\w+)", piece)
            if name and name.group(1).lower() in VERBATIM and not piece.endswith("/>"):
                if piece.startswith("</"):
                    if inside:
                        inside.pop()
                else:
                    inside.append(name.group(1).lower())
        elif not inside and piece.strip():
            for pattern, anchor in patterns:
                piece = pattern.sub(lambda match: f'<a href="{target}#{anchor}">{match.group(0)}</a>', piece)
            pieces[number] = piece
    return "".join(pieces)
