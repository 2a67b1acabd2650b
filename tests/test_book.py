"""The book (``python -m tutorials.book``): built strictly, then read in headless Chromium.

The student's book is built once per session, by the README's command, into a temporary folder.
A broken link, a missing figure or an equation that does not convert fails the build (planted in a
small tree of its own). Chromium (Debian's ``chromium``; .ci/run installs it as root) opens every
page from disk, with no server, and every page must load with no console error, no broken image,
every equation drawn as math, and every link into the site (file and anchor) found. Screenshots of
chapters 1 and 3 (at chapter 1's first equation and chapter 3's first figure) are written to
build/book-screenshots/ (the test prints the path) for a person to look at.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.browser import chromium

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "book-screenshots"
CHAPTERS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.md"))
DOCS = "the book's build comes with the test extra: pip install -e '.[test]' (or '.[docs]')"


def build(out, *flags):
    return subprocess.run([sys.executable, "-m", "tutorials.book", "--out", str(out), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    for module in ("mkdocs", "material", "mkdocstrings", "latex2mathml"):
        pytest.importorskip(module, reason=DOCS)
    out = tmp_path_factory.mktemp("book") / "site"
    done = build(out)
    assert done.returncode == 0, f"the book did not build:\n{done.stderr}"
    assert done.stdout.strip() == str(out / "index.html")
    return out


def page_of(chapter):
    return "index.html" if chapter.name.startswith("01_") else chapter.stem + ".html"


def test_every_chapter_the_references_and_each_packages_api_is_a_page_and_the_answers_are_not(site):
    for chapter in CHAPTERS:
        assert (site / page_of(chapter)).exists(), f"{chapter.name} has no page"
    assert "Chapter 1" in (site / "index.html").read_text().split("<title>")[1].split("</title>")[0]
    for page in ("references.html", "cite_and_teach.html"):
        assert (site / page).exists(), page
    for package in ("minidl", "minidl.conv", "collectives", "algorithms", "algorithms.core", "algorithms.ps"):
        text = (site / "api" / f"{package}.html").read_text()
        assert f'id="{package}' in text, f"the API page of {package} shows none of its docstrings"
    # the prose's multiplication signs stay signs, not emphasis (chapter 1: "close to kh*kw = 9 times")
    assert "close to kh*kw = 9 times" in (site / "index.html").read_text()
    ring = (site / "api" / "collectives.html").read_text()
    assert 'id="collectives.ring.ring_allreduce_in_place"' in ring
    # a docstring's citation links its entry in the references, as every chapter's does
    assert '<a href="../references.html#thakur2005">Thakur, Rabenseifner &amp; Gropp' in ring
    algorithms = (site / "api" / "algorithms.html").read_text()
    assert '<a href="../references.html#dean2012">Dean et al. 2012</a>' in algorithms
    # every chapter's exercises are on its page; the worked answers only in the instructor's book
    for chapter in CHAPTERS:
        assert 'id="exercises"' in (site / page_of(chapter)).read_text(), f"{chapter.name}: no Exercises section"
    assert not (site / "answers.html").exists()
    answer = "it is there only to keep"              # from the worked answer to E1.1
    assert answer in (ROOT / "tutorials" / "assignments" / "answers.md").read_text()
    assert not any(answer in page.read_text() for page in site.rglob("*.html")), "a worked answer is in the book"


def test_the_instructors_book_has_the_worked_answers(tmp_path, site):
    done = build(tmp_path / "key", "--instructor")
    assert done.returncode == 0, done.stderr
    answers = (tmp_path / "key" / "answers.html").read_text()
    assert "it is there only to keep" in answers
    assert 'href="answers.html"' in (tmp_path / "key" / "index.html").read_text()


def small_tree(root, chapter_text):
    """A repository of one chapter and three one-line packages, enough for the book to build from."""
    (root / "tutorials" / "figures" / "out").mkdir(parents=True)
    for name in ("references.md", "cite_and_teach.md"):
        shutil.copy2(ROOT / "tutorials" / name, root / "tutorials" / name)
    (root / "tutorials" / "01_autograd_and_layers.md").write_text(chapter_text)
    for package in ("minidl", "collectives", "algorithms"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(f'"""The {package} package."""\n')
    return root


def test_a_broken_link_a_missing_figure_or_an_equation_that_does_not_convert_stops_the_build(tmp_path):
    # one small tree, built three times: clean (it builds), with three bad links (each one named), with a bad equation
    for module in ("mkdocs", "material", "mkdocstrings", "latex2mathml"):
        pytest.importorskip(module, reason=DOCS)
    from tutorials.book import build as book

    chapter = "# Chapter 1: a chapter\n\nSome prose, with $x^2$ inline, and\n\n$$\n\\frac{a}{b}\n$$\n\n"
    tree = small_tree(tmp_path / "tree", chapter)
    assert book.build(tmp_path / "site", root=tree).exists(), "the small tree without a fault should build"
    links = {"See [the ring](03_nothing_here.md).": "03_nothing_here.md",
             "![a figure](figures/out/01_gone.png)": "01_gone.png",
             "Cited: [Nobody 1999](references.md#nobody1999).": "nobody1999"}
    (tree / "tutorials" / "01_autograd_and_layers.md").write_text(chapter + "\n\n".join(links))
    with pytest.raises(ValueError) as stopped:
        book.build(tmp_path / "site", root=tree)
    for fault, said in links.items():
        assert said in str(stopped.value), f"the build did not name {fault!r}:\n{stopped.value}"
    (tree / "tutorials" / "01_autograd_and_layers.md").write_text(chapter + "$$\n\\frac{a}{\n$$\n")
    with pytest.raises(ValueError, match="does not convert"):
        book.build(tmp_path / "site", root=tree)


def test_a_tree_without_answers_has_no_instructors_book_and_a_bad_out_is_one_error_line(tmp_path):
    from tutorials.book import build as book

    (tmp_path / "file").write_text("")
    done = build(tmp_path / "file" / "site")
    assert done.returncode == 2 and done.stderr.startswith("error: --out ") and len(done.stderr.splitlines()) == 1, \
        done.stderr

    tree = small_tree(tmp_path / "tree", "# Chapter 1\n")
    with pytest.raises(ValueError, match="answers.md is missing"):
        book.stage(tmp_path / "docs", instructor=True, root=tree)


SHOWN = {"index.html": "math", "03_collectives.html": "img"}     # the two chapters photographed, and where
SEARCH = """new Promise(done => {
  document.querySelector("label[for=__search]").click();
  const box = document.querySelector("input[data-md-component=search-query]");
  box.focus(); box.value = "rabenseifner"; box.dispatchEvent(new Event("input", {bubbles: true}));
  let tries = 0;
  const look = () => { const found = document.querySelectorAll(".md-search-result__item").length;
    if (found || ++tries > 100) done(found); else setTimeout(look, 100); };
  look();
})"""


# decided before the book is built for it: where Chromium is missing, the skip costs nothing
NO_CHROMIUM = "chromium is not on PATH: apt-get install chromium (Debian; .ci/run installs it as root)"


@pytest.mark.timeout(300)
@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_every_page_of_the_book_loads_in_chromium_from_disk_with_nothing_broken(site):
    pytest.importorskip("websocket", reason="websocket-client comes with the test extra: pip install -e '.[test]'")
    from tests.browser import Browser

    executable = chromium()
    pages = sorted(page for page in site.rglob("*.html") if page.name != "404.html")
    reports, problems = {}, []
    SHOTS.mkdir(parents=True, exist_ok=True)
    with Browser(executable) as browser:
        for page in pages:
            name = page.relative_to(site).as_posix()
            report = reports[page] = browser.load(page.as_uri())
            problems += [f"{name}: {error}" for error in report["errors"]]
            problems += [f"{name}: image {src} did not load" for src in report["broken_images"]]
            problems += [f"{name}: an equation is shown as {shown!r}, not as math" for shown in report["maths"]
                         if shown not in ("math", "block math", "inline math")]
            problems += [f"{name}: a fraction is not drawn as one" for drawn in report["fractions"] if not drawn]
            problems += [f"{name}: TeX left in the text: {left}" for left in report["tex_left"]]
            if report["wrappers_left"]:
                problems.append(f"{name}: {report['wrappers_left']} equation(s) never converted")
            if name in SHOWN:                # scrolled to what a person should see drawn: an equation, a figure
                browser.evaluate(f"document.querySelector('article {SHOWN[name]}').scrollIntoView({{block: 'center'}})")
                browser.evaluate("new Promise(done => setTimeout(done, 200))")
                browser.screenshot(SHOTS / name.replace(".html", ".png"))
        browser.load((site / "index.html").as_uri())
        found = browser.evaluate(SEARCH)
        assert not browser.errors()
    print(f"\nscreenshots of chapters 1 and 3: {SHOTS}")
    assert found > 0, "searching the book from disk for 'rabenseifner' found nothing"
    # every link into the site reaches a file, and an anchor that the page holds
    ids = {page: set(report["ids"]) for page, report in reports.items()}
    for page, report in reports.items():
        for link in report["links"]:
            parts = urlsplit(link)
            if parts.scheme != "file":
                continue
            target = Path(unquote(parts.path))
            if not target.exists():
                problems.append(f"{page.relative_to(site)}: dead link {link}")
            elif parts.fragment and target in ids and unquote(parts.fragment) not in ids[target]:
                problems.append(f"{page.relative_to(site)}: no #{parts.fragment} in {target.name}")
    assert not problems, "\n".join(problems[:40])
    # what a reader comes for: chapter 1's equations, each chapter's figures inline, highlighted code
    first = reports[site / "index.html"]
    assert first["maths"] and first["fractions"], "chapter 1 shows no equation"
    for chapter in CHAPTERS:
        report = reports[site / page_of(chapter)]
        figures = len(re.findall(r"!\[[^\]]*\]\(figures/out/", chapter.read_text()))
        assert report["images"] >= figures, f"{chapter.name}: {report['images']} images for {figures} figures"
        assert report["highlighted"] > 0, f"{chapter.name}: its code is not highlighted"
    assert all(shot.stat().st_size > 10_000 for shot in SHOTS.glob("*.png")) and len(list(SHOTS.glob("*.png"))) == 2
