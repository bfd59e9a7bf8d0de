"""timekit: calendar arithmetic and human-readable durations."""

from timekit.calendar import add_months, days_in_month, is_leap_year
from timekit.duration import format_duration, parse_duration

__all__ = ["add_months", "days_in_month", "is_leap_year", "format_duration", "parse_duration"]
__version__ = "0.5.1"
