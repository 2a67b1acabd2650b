"""Build the book: every chapter a page, the bibliography, the API from the docstrings, one folder.

    python -m tutorials.book                    # the student's book: build/book/index.html
    python -m tutorials.book --instructor       # + the worked answers: build/book-instructor/index.html
    python -m tutorials.book --out DIR          # into DIR instead

MkDocs with the Material theme builds it (``pip install -e ".[docs]"``), strict: a broken link or
anchor, a missing figure, a docstring the API pages cannot read, an equation that does not convert
each stops the build with ``error:``. The site opens from disk (file://) with no network: no web
fonts, the search index inlined (Material's offline plugin), and equations written as MathML when
the site is built (``hooks.py``), which the browser draws without a script. Every chapter links
the works it cites to their entries in the references; on the API pages ``hooks.py`` links the
docstrings' author-and-year citations the same way.

The pages are staged in a temporary folder first: chapter 1 becomes ``index.md`` (the page the site
opens on), the figures the chapters show come from ``tutorials/figures/out/``, and one API page per
package lists its modules (mkdocstrings reads the source; nothing is imported). The worked answers
(``tutorials/assignments/answers.md``) are staged only with ``--instructor``; a student tree made by
``python -m tutorials.assignments make`` has no answers file, so its book has none either.
"""
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from collectives import cli

ROOT = Path(__file__).resolve().parent.parent.parent
HERE = Path(__file__).resolve().parent
PACKAGES = ["minidl", "collectives", "algorithms"]
FIGURES = (".png", ".svg", ".jpg")
FIRST = "01_autograd_and_layers.md"
CHAPTER_LINK = re.compile(r"\]\(" + re.escape(FIRST))


# What Markdown must leave alone: fenced blocks, code spans, equations. Outside them, a '*' between two
# letters or digits is the prose's multiplication sign (kh*kw), which Markdown would read as emphasis.
VERBATIM = re.compile(r"^```.*?^```|`[^`\n]+`|\$\$.*?\$\$|\$[^$\n]+\$", re.S | re.M)
TIMES = re.compile(r"(?<=\w)\*(?=\w)")


def plain_stars(text):
    """``text`` with each multiplication sign outside code and equations escaped, so it stays a '*'."""
    pieces, start = [], 0
    for match in VERBATIM.finditer(text):
        pieces += [TIMES.sub(r"\\*", text[start:match.start()]), match.group(0)]
        start = match.end()
    return "".join(pieces + [TIMES.sub(r"\\*", text[start:])])


def chapters(root=ROOT):
    return sorted((Path(root) / "tutorials").glob("[0-9][0-9]_*.md"))


def api_packages(root=ROOT):
    """Every package under minidl/, collectives/, algorithms/ (a folder with __init__.py), dotted, in order."""
    found = []
    for top in PACKAGES:
        for init in sorted((Path(root) / top).rglob("__init__.py")):
            parts = init.parent.relative_to(root).parts
            if not any(part.startswith(("_", ".")) for part in parts):
                found.append(".".join(parts))
    return found


def api_page(package, root=ROOT):
    """The markdown of one package's API page: its own docstring, then each public module's."""
    folder = Path(root).joinpath(*package.split("."))
    modules = sorted(path.stem for path in folder.glob("*.py") if not path.stem.startswith("_"))
    lines = [f"# `{package}`", "",
             "Generated from the docstrings (module headers first). Works cited by author and year are "
             "in the [references](../references.md).", "",
             f"::: {package}", "    options:", "      members: false", "      show_root_heading: false", ""]
    for module in modules:
        lines += [f"::: {package}.{module}", ""]
    return "\n".join(lines)


def stage(docs, instructor, root=ROOT):
    """Write the site's pages into folder ``docs``; returns the nav (a list for mkdocs.yml)."""
    root = Path(root)
    tutorials = root / "tutorials"
    docs.mkdir(parents=True, exist_ok=True)
    nav_chapters = []
    for path in chapters(root):
        name = "index.md" if path.name == FIRST else path.name
        (docs / name).write_text(plain_stars(CHAPTER_LINK.sub("](index.md", path.read_text())))
        nav_chapters.append(name)
    for page in ("references.md", "cite_and_teach.md"):
        (docs / page).write_text(CHAPTER_LINK.sub("](index.md", (tutorials / page).read_text()))
    figures = docs / "figures" / "out"
    figures.mkdir(parents=True)
    for image in sorted((tutorials / "figures" / "out").iterdir()):
        if image.suffix in FIGURES:
            shutil.copy2(image, figures / image.name)
    nav = [{"Chapters": nav_chapters}, {"References": "references.md"},
           {"How to cite and teach": "cite_and_teach.md"}]
    if instructor:
        answers = tutorials / "assignments" / "answers.md"
        if not answers.exists():
            raise ValueError(f"--instructor: {answers.relative_to(root)} is missing (a student tree has none)")
        (docs / "answers.md").write_text(plain_stars(answers.read_text()))
        nav.append({"Worked answers": "answers.md"})
    (docs / "api").mkdir()
    api = []
    for package in api_packages(root):
        (docs / "api" / f"{package}.md").write_text(api_page(package, root))
        api.append({package: f"api/{package}.md"})
    nav.append({"API": api})
    for asset in ("extra.css", "iframe-worker.js"):
        shutil.copy2(HERE / asset, docs / asset)
    return nav


def config(docs, site, nav, instructor, root=ROOT):
    """mkdocs.yml's settings, as a dict."""
    warn = "warn"
    return {
        "site_name": "minidl: the book" + (" (instructor)" if instructor else ""),
        "docs_dir": str(docs), "site_dir": str(site), "use_directory_urls": False, "strict": True,
        "validation": {"nav": {"omitted_files": warn, "not_found": warn, "absolute_links": warn},
                       "links": {"not_found": warn, "anchors": warn, "absolute_links": warn,
                                 "unrecognized_links": warn}},
        "nav": nav,
        "theme": {"name": "material", "font": False, "features": ["navigation.sections", "navigation.top",
                                                                   "search.highlight", "content.code.copy"]},
        "extra_css": ["extra.css"],
        "extra": {"polyfills": ["iframe-worker.js"]},       # search from disk without the network (that file)
        "hooks": [str(HERE / "hooks.py")],
        "markdown_extensions": [
            {"toc": {"permalink": True}}, "tables", "admonition", "attr_list",
            {"pymdownx.highlight": {"use_pygments": True}}, "pymdownx.superfences",
            {"pymdownx.arithmatex": {"generic": True}}],
        "plugins": ["search", "offline", {"mkdocstrings": {"handlers": {"python": {
            "paths": [str(root)],
            "options": {"docstring_style": None, "show_source": False, "members_order": "source",
                        "show_root_heading": True, "heading_level": 2, "filters": ["!^_"],
                        "show_signature_annotations": False, "show_bases": False}}}}}],
    }


def build(out, instructor=False, root=ROOT):
    """Stage the pages and run ``mkdocs build --strict`` into ``out``; raises ValueError on any warning."""
    import yaml

    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="minidl-book-") as work:
        docs = Path(work) / "docs"
        nav = stage(docs, instructor, root)
        settings = Path(work) / "mkdocs.yml"
        settings.write_text(yaml.safe_dump(config(docs, out, nav, instructor, root), sort_keys=False))
        command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(settings)]
        # not -q: it would hide the warnings that strict mode counts. NO_MKDOCS_2_WARNING: Material's notice
        # of its end of life (May 2027; the README says what follows), printed on every build otherwise
        done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    if done.returncode != 0:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        problems = [re.sub(r"\s+", " ", line) for line in said if re.match(r"(WARNING|ERROR)", line)] or said[-1:]
        raise ValueError("mkdocs build --strict failed: " + " | ".join(problems[:20]))
    return out / "index.html"


def main(argv=None):
    parser = cli.Parser(prog="python -m tutorials.book", description=__doc__.splitlines()[0])
    parser.add_argument("--instructor", action="store_true", help="include the worked answers")
    parser.add_argument("--out", type=Path, default=None,
                        help="the site's folder (default build/book, or build/book-instructor)")
    args = parser.parse_args(argv)
    out = args.out or ROOT / "build" / ("book-instructor" if args.instructor else "book")
    try:
        for module in ("mkdocs", "material", "mkdocstrings", "latex2mathml"):     # all there: the build can start
            importlib.import_module(module)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ValueError(f"--out {out}: {error.strerror}") from None
        print(build(out, args.instructor))
        return 0
    except ImportError as error:
        message = f"{error.name} is not installed: pip install -e \".[docs]\""
    except (ValueError, OSError) as error:
        message = str(error)
    print(f"error: {message}", file=sys.stderr)
    return 2
