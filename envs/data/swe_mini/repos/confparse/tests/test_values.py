import pytest
from confparse import to_bool, to_int, to_list


def test_to_bool_true_false():
    assert to_bool("true") is True and to_bool("False") is False


def test_to_bool_false_words():
    assert not to_bool("no") and not to_bool("off") and not to_bool("0")


def test_to_int_hex():
    assert to_int("0x1f") == 31


def test_to_int_rejects_text():
    with pytest.raises(ValueError):
        to_int("ten")


def test_to_list_basic():
    assert to_list("a, b, c") == ["a", "b", "c"]
