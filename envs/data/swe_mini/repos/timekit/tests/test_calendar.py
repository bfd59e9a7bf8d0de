import datetime as dt

from timekit import add_months, days_in_month, is_leap_year


def test_leap_years():
    assert is_leap_year(2024) and not is_leap_year(2023)


def test_century_is_not_leap():
    assert not is_leap_year(1900)


def test_days_in_month():
    assert days_in_month(2023, 2) == 28 and days_in_month(2023, 4) == 30


def test_add_months_simple():
    assert add_months(dt.date(2023, 3, 15), 2) == dt.date(2023, 5, 15)
