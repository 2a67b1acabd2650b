"""The book: the chapters as a static site that opens from disk (``python -m tutorials.book``)."""
