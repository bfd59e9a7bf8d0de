import math


def clamp(x, lo, hi):
    """`x` limited to [lo, hi]; lo > hi is an error."""
    if lo > hi:
        raise ValueError(f"lo ({lo}) must not exceed hi ({hi})")
    return max(lo, min(hi, x))


def round_half_up(x, digits=0):
    """Round halves away from zero like a cashier: 2.5 -> 3, -2.5 -> -3 (round() would give 2 and -2)."""
    q = 10**digits
    return math.copysign(math.floor(abs(x) * q + 0.5) / q, x)


def percent_change(old, new):
    if old == 0:
        raise ValueError("percent change from zero is undefined")
    return (new - old) / abs(old) * 100
