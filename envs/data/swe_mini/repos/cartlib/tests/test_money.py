import pytest
from cartlib import apply_discount, format_money, parse_coupon, parse_money


def test_format_money_thousands():
    assert format_money(123450) == "$1,234.50"


def test_parse_money():
    assert parse_money("$1,234.50") == 123450


def test_parse_money_rejects_text():
    with pytest.raises(ValueError):
        parse_money("ten dollars")


def test_parse_coupon():
    assert parse_coupon("SAVE15") == 15


def test_apply_discount_rounds_half_up():
    assert apply_discount(5, 50) == 3
