from collections import Counter


def mean(xs):
    xs = list(xs)
    if not xs:
        raise ValueError("mean of empty data")
    return sum(xs) / len(xs)


def median(xs):
    """Middle value of the sorted data; the mean of the two middle values for an even count."""
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        raise ValueError("median of empty data")
    mid = n // 2
    if n % 2:
        return xs[mid]
    return (xs[mid - 1] + xs[mid]) / 2


def mode(xs):
    """Most common value; ties go to the value seen first."""
    xs = list(xs)
    if not xs:
        raise ValueError("mode of empty data")
    counts = Counter(xs)
    best = max(counts.values())
    return next(x for x in xs if counts[x] == best)
