from csvlite import quote_field, write_rows


def test_quote_plain():
    assert quote_field("abc") == "abc"


def test_quote_none():
    assert quote_field(None) == ""


def test_quote_quotes():
    assert quote_field('say "hi"') == '"say ""hi"""'


def test_write_rows():
    assert write_rows([{"a": 1, "b": 2}], ["a", "b"]) == "a,b\n1,2\n"
