from textkit import truncate, wrap


def test_truncate_short_text_unchanged():
    assert truncate("hi", 10) == "hi"


def test_wrap_basic():
    assert wrap("one two three four", 9)[:2] == ["one two", "three"]


def test_wrap_empty():
    assert wrap("", 5) == []
