import pytest
from timekit import format_duration, parse_duration


def test_parse_duration():
    assert parse_duration("1h30m") == 5400


def test_parse_duration_spaces():
    assert parse_duration("2m 5s") == 125


def test_parse_duration_rejects_junk():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_format_duration():
    assert format_duration(5400) == "1h 30m"


def test_format_duration_zero():
    assert format_duration(0) == "0s"
