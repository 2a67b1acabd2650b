"""One check for the tutorials' figure tests: the sentences a chapter quotes from its JSON."""


def assert_quoted(quoted, text, where="the chapter"):
    """Every sentence in ``quoted`` (built from the JSON) appears in ``text`` verbatim."""
    missing = [sentence for sentence in quoted if sentence not in text]
    assert not missing, f"{where} does not quote these as generated: {missing}"
