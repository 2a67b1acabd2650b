"""MkDocs hook of the book: equations become MathML when the site is built, so pages need no script.

pymdownx.arithmatex (generic mode) leaves ``$...$`` as ``<span class="arithmatex">\\(...\\)</span>`` and
``$$...$$`` as ``<div class="arithmatex">\\[...\\]</div>``; each becomes ``<math>`` here, which browsers
draw themselves (MathML Core), from disk, with no network and no JavaScript. An equation that
latex2mathml cannot read stops the build, naming the page.
"""
import html
import re

from latex2mathml.converter import convert

MATH = re.compile(r'<(span|div) class="arithmatex">\\[(\[](.*?)\\[)\]]</\1>', re.S)


def on_page_content(content, page, **kwargs):
    def mathml(match):
        tag, latex = match.group(1), html.unescape(match.group(2)).strip()
        try:
            return convert(latex, display="block" if tag == "div" else "inline")
        except Exception as error:            # latex2mathml raises several kinds; any one is a bad equation
            raise ValueError(f"{page.file.src_path}: equation {latex!r} does not convert: {error}") from None
    return MATH.sub(mathml, content)
