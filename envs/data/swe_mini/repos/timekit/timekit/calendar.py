import datetime as dt

DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year: int) -> bool:
    """Gregorian rule: every 4th year, except centuries, except every 400th year."""
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year: int, month: int) -> int:
    if not 1 <= month <= 12:
        raise ValueError(f"month must be 1..12, got {month}")
    return 29 if month == 2 and is_leap_year(year) else DAYS[month - 1]


def add_months(d: dt.date, months: int) -> dt.date:
    """The same day `months` later (or earlier); the day is clamped to the month's length (Jan 31 + 1 -> Feb 28)."""
    index = d.year * 12 + (d.month - 1) + months
    year, month0 = divmod(index, 12)
    month = month0 + 1
    return dt.date(year, month, min(d.day, days_in_month(year, month)))
