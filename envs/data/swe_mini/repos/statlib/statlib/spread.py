import math

from statlib.central import mean


def variance(xs, sample=True):
    """Sample variance (n - 1 in the denominator) by default; population variance with sample=False."""
    xs = list(xs)
    n = len(xs)
    if n < (2 if sample else 1):
        raise ValueError("not enough data for a variance")
    m = mean(xs)
    ss = sum((x - m) ** 2 for x in xs)
    return ss / (n - 1 if sample else n)


def stdev(xs, sample=True):
    return math.sqrt(variance(xs, sample))


def value_range(xs):
    xs = list(xs)
    if not xs:
        raise ValueError("range of empty data")
    return max(xs) - min(xs)
