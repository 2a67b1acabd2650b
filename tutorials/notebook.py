"""A tutorial chapter as a Jupyter notebook: the markdown stays the source, MPI blocks run through mpiexec.

    python -m tutorials.notebook 04                  # writes tutorials/notebooks/04_data_parallelism.ipynb
    python -m tutorials.notebook 04 --out hw         # ... into hw/ instead
    python -m tutorials.notebook 01 --execute        # ... and runs it, outputs saved (needs nbclient, ipykernel)
    jupyter notebook tutorials/notebooks/            # then open it (pip install -e ".[tutorials]")

jupytext reads ``tutorials/NN_*.md`` into cells: prose becomes markdown cells, each ```python block a
code cell; ```bash and ```text blocks stay shown, not run, as in the test suite. A block whose first
line is ``# mpiexec -n N`` becomes a cell that starts with the cell magic ``%%mpiexec -n N``: running it
writes the cell to a file and runs ``mpiexec -n N python FILE`` from the repository root through the
block runner (tutorials/block.py, BLAS on one thread per rank), and prints the ranks' output in the
cell. So a student can edit an MPI program in the notebook, or its rank count, and run it again. The
other cells run in the notebook's kernel, in order, in one namespace, exactly as the tests run them.
A first cell moves the kernel to the repository root and loads the magic (``%load_ext tutorials.notebook``).
It finds that root from the ``minidl`` the kernel's Python imports (installed with ``pip install -e .``, so
the checkout's), never from a path written into the notebook: a notebook opens and runs from any folder.
Its figures travel inside it, as attachments of the markdown cells, and the entries of references.md it
cites in a last cell that its citations link to, so it (and its HTML export) shows them wherever it is copied.

Why a generated notebook and not a jupytext pairing: the markdown is what the tests run and what
the course hands out; a paired notebook would write every edit a student makes, and the magics,
back into it. Here the notebook is the student's own copy: regenerating it from the markdown picks
up a revised chapter, and it refuses to overwrite a notebook (and its edits) without ``--force``.
(jupytext's Jupyter extension also opens the ``.md`` itself as a notebook, but there an MPI block
is plain code and runs in the kernel on one rank: open the generated notebook instead.)
"""
import argparse
import base64
import os
import re
import shlex
import sys
from pathlib import Path

from collectives import cli
from tutorials.block import MPI_LINE, ROOT, blocks, chapter_file, run_mpi

OUT = ROOT / "tutorials" / "notebooks"
LINK = re.compile(r"(\]\()([^)\s#]+)")             # ](target: a markdown link's or image's target, up to '#'
CITED = re.compile(r"\]\(references\.md(?:#([a-z0-9]+))?\)")   # ](references.md#key) or ](references.md)
ENTRY = re.compile(r"^### \[(\w+)\]\n(.*?)(?=^##)", re.S | re.M)    # one entry of tutorials/references.md
IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s#]+)(\))")   # ![alt](target)
KINDS = {".png": "image/png", ".jpg": "image/jpeg", ".svg": "image/svg+xml"}


def relink(text, source, out):
    """``text`` with the relative links of a file in folder ``source`` made to work from folder ``out``."""
    def moved(match):
        target = match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith(("/", "#")):     # https:, mailto:, attachment:
            return match.group(0)
        return match.group(1) + Path(os.path.relpath(Path(source) / target, Path(out))).as_posix()
    return LINK.sub(moved, text)


def cite(text, cited):
    """``text`` with its links into references.md made links into the notebook's own references cell."""
    def inside(match):
        key = match.group(1) or "references"
        cited.add(key)
        return f"](#{key})"
    return CITED.sub(inside, text)


def references_cell(cited, root=ROOT):
    """The markdown of the entries of tutorials/references.md named in ``cited``, each under its own anchor."""
    entries = ENTRY.findall((Path(root) / "tutorials" / "references.md").read_text() + "\n## end")
    parts = ['<a id="references"></a>', "## References", "",
             "*The entries of `tutorials/references.md` that this chapter cites.*"]
    for key, body in entries:
        if key.lower() in cited:
            parts += ["", f'<a id="{key.lower()}"></a>', f"**[{key}]**", "", body.strip()]
    return "\n".join(parts)


def attach(text, source, attachments):
    """``text`` with each local image (a path relative to folder ``source``) an ``attachment:``, its bytes
    base64 in ``attachments`` (a cell's attachments: name -> {mime type: data})."""
    def inside(match):
        target = Path(source) / match.group(2)
        if "://" in match.group(2) or target.suffix not in KINDS:
            return match.group(0)
        attachments[target.name] = {KINDS[target.suffix]: base64.b64encode(target.read_bytes()).decode("ascii")}
        return f"{match.group(1)}attachment:{target.name}{match.group(3)}"
    return IMAGE.sub(inside, text)


def notebook(chapter, out=OUT, root=ROOT):
    """The chapter's notebook (an nbformat v4 node) for folder ``out``: set-up cell, then its prose and blocks."""
    import jupytext
    import nbformat

    path = chapter_file(chapter, root)
    python = [code.rstrip("\n") for code in blocks(path)]
    read = jupytext.reads(path.read_text(), fmt="md")
    cells, waiting, cited = [], list(python), set()
    for cell in read.cells:
        if cell.cell_type == "code" and waiting and cell.source == waiting[0]:
            waiting.pop(0)
            lines = cell.source.splitlines()
            ranks = MPI_LINE.match(lines[0].strip()) if lines else None
            source = "\n".join([f"%%mpiexec -n {ranks.group(1)}", *lines[1:]]) if ranks else cell.source
            cells.append(nbformat.v4.new_code_cell(source))
            continue
        attachments = {}
        if cell.cell_type == "code":                 # a ```bash block, which jupytext makes a %%bash cell
            magic, _, body = cell.source.partition("\n")
            text = f"```{magic.removeprefix('%%').strip()}\n{body}\n```"
        else:
            text = relink(cite(attach(cell.source, path.parent, attachments), cited), path.parent, Path(out).resolve())
        if cells and cells[-1].cell_type == "markdown":
            cells[-1].source += "\n\n" + text
        else:
            cells.append(nbformat.v4.new_markdown_cell(text))
        if attachments:
            cells[-1].setdefault("attachments", {}).update(attachments)
    if waiting:                                      # jupytext and the test suite disagree on the blocks
        raise ValueError(f"{path.name}: {len(waiting)} python block(s) not read as code cells by jupytext, "
                         f"the first: {waiting[0].splitlines()[0]!r}")
    note = (f"*Made from `tutorials/{path.name}` by `python -m tutorials.notebook {path.name[:2]}`; the markdown is "
            "the source, this notebook your copy. Run the first cell first. A cell that starts with "
            "`%%mpiexec -n N` runs as an MPI program on N ranks (edit N to try another count); the other "
            "cells run here, in order, in one namespace.*")
    setup = ("# set-up: the working directory is the root of the minidl checkout this kernel's Python has installed\n"
             "# (pip install -e .), so the chapter's paths hold wherever this notebook is; %%mpiexec runs a cell on "
             "N ranks\n"
             "import os, pathlib, sys\n"
             "import minidl\n"
             "root = pathlib.Path(minidl.__file__).resolve().parent.parent\n"
             "assert (root / 'tutorials').is_dir(), f'minidl is installed from {root}, not a checkout: pip install "
             "-e . in one'\n"
             "os.chdir(root)\n"
             "sys.path.insert(0, str(root))\n"
             "%load_ext tutorials.notebook")
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_markdown_cell(note), nbformat.v4.new_code_cell(setup), *cells]
    if cited:
        book.cells.append(nbformat.v4.new_markdown_cell(references_cell(cited, root)))
    book.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                     "language_info": {"name": "python"}}
    return book


def execute(book, timeout=300, folder=None):
    """Run every cell of ``book`` in a fresh python3 kernel started in ``folder`` (default: the current
    one, as Jupyter starts a notebook's kernel in the notebook's folder), in place; a failing cell raises."""
    from nbclient import NotebookClient

    folder = str(Path.cwd() if folder is None else folder)
    NotebookClient(book, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": folder}}).execute()
    return book


class MPIBlockFailed(RuntimeError):
    """An ``%%mpiexec`` cell whose ranks exited with a non-zero status."""


def mpiexec(line, cell):
    """``%%mpiexec -n N``: run the cell as ``mpiexec -n N python FILE`` from the repository root."""
    parser = argparse.ArgumentParser(prog="%%mpiexec", add_help=False)
    parser.add_argument("-n", type=int, required=True, help="ranks")
    try:
        args = parser.parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError(f"%%mpiexec wants '-n N', got {line!r}") from None
    status = run_mpi(cell, args.n, "notebook_cell", ROOT, echo=lambda text: print(text, end="", flush=True))
    if status != 0:
        raise MPIBlockFailed(f"mpiexec -n {args.n} exited with status {status} (the ranks' output is above)")


def load_ipython_extension(ipython):
    """``%load_ext tutorials.notebook`` registers the ``%%mpiexec`` cell magic."""
    ipython.register_magic_function(mpiexec, magic_kind="cell", magic_name="mpiexec")


def main(argv=None):
    parser = cli.Parser(prog="python -m tutorials.notebook", description=__doc__.splitlines()[0])
    parser.add_argument("chapter", help="the chapter's number, e.g. 04")
    parser.add_argument("--out", type=Path, default=OUT, help="folder for the .ipynb (default "
                                                              f"{OUT.relative_to(ROOT)})")
    parser.add_argument("--force", action="store_true", help="overwrite a notebook that exists (and its edits)")
    parser.add_argument("--execute", action="store_true", help="run every cell and save the outputs")
    args = parser.parse_args(argv)
    try:
        import nbformat

        path = chapter_file(args.chapter)
        target = args.out / f"{path.stem}.ipynb"
        if target.exists() and not args.force:
            raise ValueError(f"{target} exists (a student's edits?): --force overwrites it")
        book = notebook(args.chapter, args.out)
        args.out.mkdir(parents=True, exist_ok=True)
        if args.execute:
            from nbclient.exceptions import CellExecutionError
            try:
                execute(book, folder=args.out)
            except CellExecutionError as error:
                raise ValueError(f"a cell of {path.stem} failed:\n{error}") from None
        nbformat.write(book, target)
    except ImportError as error:
        print(f"error: {error.name} is not installed: pip install -e \".[tutorials]\"", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
