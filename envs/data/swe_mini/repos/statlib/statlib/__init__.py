"""statlib: descriptive statistics for plain Python lists."""

from statlib.central import mean, median, mode
from statlib.spread import stdev, value_range, variance
from statlib.util import clamp, percent_change, round_half_up

__all__ = [
    "mean",
    "median",
    "mode",
    "stdev",
    "value_range",
    "variance",
    "clamp",
    "percent_change",
    "round_half_up",
]
__version__ = "1.2.0"
