"""The source templates of generated SWE tasks: small, pure Python functions grouped by theme (a theme becomes one
module), each with the inputs its tests call it on (expected outputs come from running the correct code). `deps` are
functions of the same theme a function calls, generated with it. No `while` or recursion: `generate.run_module`'s
line budget stops the few injected bugs that still loop (a loop over the list it appends to).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Fn:
    name: str
    source: str
    inputs: tuple[tuple, ...]
    deps: tuple[str, ...] = ()


def _fn(name: str, source: str, inputs: list[tuple], deps: tuple[str, ...] = ()) -> Fn:
    return Fn(name, source.strip("\n"), tuple(inputs), deps)


THEMES: dict[str, list[Fn]] = {
    "text": [
        _fn(
            "truncate",
            '''
def truncate(text, width):
    """Cut text to at most width characters, marking the cut with '...'."""
    if len(text) <= width:
        return text
    if width < 4:
        return text[:width]
    return text[:width - 3] + '...'
''',
            [
                ("hello", 10),
                ("hello world", 8),
                ("abcdef", 6),
                ("abcdefg", 6),
                ("abcdef", 3),
                ("", 0),
                ("abcde", 4),
                ("truncate me please", 12),
            ],
        ),
        _fn(
            "count_vowels",
            '''
def count_vowels(text):
    """Number of vowels (a, e, i, o, u) in text, in either case."""
    count = 0
    for ch in text.lower():
        if ch in 'aeiou':
            count += 1
    return count
''',
            [("hello",), ("AEIOU",), ("rhythm",), ("",), ("Programming In Python",), ("queue",)],
        ),
        _fn(
            "initials",
            '''
def initials(name):
    """'ada lovelace' -> 'A.L.'"""
    parts = name.split()
    if not parts:
        return ''
    return '.'.join((p[0].upper() for p in parts)) + '.'
''',
            [("ada lovelace",), ("Grace Brewster Hopper",), ("",), ("  alan   turing ",), ("x",)],
        ),
        _fn(
            "pad_number",
            '''
def pad_number(n, width):
    """n as a string of at least width digits, zero-padded, with its sign in front."""
    digits = str(abs(n))
    digits = '0' * (width - len(digits)) + digits
    if n < 0:
        return '-' + digits
    return digits
''',
            [(7, 3), (-42, 5), (12345, 3), (0, 2), (-1, 1), (99, 2)],
        ),
        _fn(
            "word_count",
            '''
def word_count(text, min_len):
    """Number of words of at least min_len characters."""
    return len([w for w in text.split() if len(w) >= min_len])
''',
            [
                ("a bb ccc dddd", 2),
                ("a bb ccc dddd", 4),
                ("", 1),
                ("one two three", 3),
                ("x", 0),
                ("hi there", 5),
            ],
        ),
        _fn(
            "camel_to_snake",
            '''
def camel_to_snake(name):
    """'parseHttpHeader' -> 'parse_http_header'"""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out.append('_')
        out.append(ch.lower())
    return ''.join(out)
''',
            [("parseHttpHeader",), ("Simple",), ("already_snake",), ("aB",), ("",), ("getX",)],
        ),
    ],
    "numbers": [
        _fn(
            "clamp",
            '''
def clamp(x, lo, hi):
    """x limited to the range [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x
''',
            [(5, 0, 3), (-2, 0, 3), (2, 0, 3), (0, 0, 3), (3, 0, 3), (10, -5, 20), (-7, -5, 20)],
        ),
        _fn(
            "mean",
            '''
def mean(values):
    """Arithmetic mean; 0.0 for no values."""
    if not values:
        return 0.0
    return sum(values) / len(values)
''',
            [([1, 2, 3, 4],), ([],), ([5],), ([2, 2, 8],), ([-3, 3, 6],), ([10, 20],)],
        ),
        _fn(
            "sign",
            '''
def sign(x):
    """1 for positive x, -1 for negative x, 0 for zero."""
    if x > 0:
        return 1
    if x < 0:
        return -1
    return 0
''',
            [(5,), (-3,), (0,), (0.5,), (-0.25,), (100,)],
        ),
        _fn(
            "digit_sum",
            '''
def digit_sum(n):
    """Sum of the decimal digits of n (its sign ignored)."""
    total = 0
    for d in str(abs(n)):
        total += int(d)
    return total
''',
            [(123,), (-45,), (0,), (9999,), (1000,), (7,)],
        ),
        _fn(
            "is_prime",
            '''
def is_prime(n):
    """True when n is a prime number."""
    if n < 2:
        return False
    for k in range(2, int(n ** 0.5) + 1):
        if n % k == 0:
            return False
    return True
''',
            [(2,), (3,), (4,), (9,), (25,), (29,), (1,), (0,), (49,), (97,)],
        ),
        _fn(
            "percent",
            '''
def percent(part, whole):
    """part as a percentage of whole, to one decimal; 0.0 when whole is 0."""
    if whole == 0:
        return 0.0
    return round(100 * part / whole, 1)
''',
            [(1, 4), (0, 0), (3, 3), (1, 3), (5, 0), (7, 8)],
        ),
        _fn(
            "factorial",
            '''
def factorial(n):
    """n! for n >= 0."""
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result
''',
            [(0,), (1,), (2,), (5,), (7,), (3,)],
        ),
        _fn(
            "median",
            '''
def median(values):
    """The middle value (the mean of the two middle ones for an even count); None for no values."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        return None
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2
''',
            [([3, 1, 2],), ([4, 1, 3, 2],), ([],), ([7],), ([5, 9],), ([10, 2, 8, 4, 6],)],
        ),
    ],
    "lists": [
        _fn(
            "chunk",
            '''
def chunk(items, size):
    """items in consecutive lists of size (the last one may be shorter)."""
    return [items[i:i + size] for i in range(0, len(items), size)]
''',
            [([1, 2, 3, 4, 5], 2), ([1, 2, 3, 4], 2), ([], 3), ([1], 1), (list("abcdefg"), 3)],
        ),
        _fn(
            "dedupe",
            '''
def dedupe(items):
    """items without repeats, in order of first appearance."""
    seen = set()
    out = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out
''',
            [([1, 2, 1, 3, 2],), ([],), (["a", "a", "a"],), ([3, 2, 1],), ([1, 1, 2, 2, 3, 3],)],
        ),
        _fn(
            "running_total",
            '''
def running_total(values):
    """The running sums: [1, 2, 3] -> [1, 3, 6]."""
    out = []
    total = 0
    for v in values:
        total += v
        out.append(total)
    return out
''',
            [([1, 2, 3],), ([],), ([5],), ([2, -2, 4, 1],), ([10, 0, 10],)],
        ),
        _fn(
            "max_index",
            '''
def max_index(values):
    """Index of the first largest value; -1 for no values."""
    if not values:
        return -1
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best
''',
            [([3, 9, 2],), ([],), ([5, 5, 1],), ([1, 2, 3, 4],), ([7],), ([-1, -5, -2],), ([2, 8, 8],)],
        ),
        _fn(
            "rotate",
            '''
def rotate(items, k):
    """items rotated left by k places."""
    if not items:
        return []
    k = k % len(items)
    return items[k:] + items[:k]
''',
            [
                ([1, 2, 3, 4], 1),
                ([1, 2, 3, 4], 5),
                ([], 2),
                ([1, 2, 3], 0),
                (["a", "b", "c"], 2),
                ([1, 2], -1),
            ],
        ),
        _fn(
            "pairwise_diff",
            '''
def pairwise_diff(values):
    """Differences of neighbours: [1, 4, 9] -> [3, 5]."""
    return [values[i + 1] - values[i] for i in range(len(values) - 1)]
''',
            [([1, 4, 9],), ([],), ([5],), ([3, 3, 3],), ([10, 7, 12, 0],)],
        ),
        _fn(
            "count_above",
            '''
def count_above(values, threshold):
    """How many values are strictly above threshold."""
    count = 0
    for v in values:
        if v > threshold:
            count += 1
    return count
''',
            [([1, 5, 10], 4), ([1, 5, 10], 5), ([], 0), ([3, 3, 3], 3), ([-1, 0, 1], -1), ([7, 8], 10)],
        ),
    ],
    "dates": [
        _fn(
            "is_leap",
            '''
def is_leap(year):
    """True for a leap year of the Gregorian calendar."""
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0
''',
            [(2000,), (1900,), (2024,), (2023,), (2100,), (1600,), (1996,)],
        ),
        _fn(
            "days_in_month",
            '''
def days_in_month(month, year):
    """Number of days in month (1-12) of year."""
    if month == 2:
        return 29 if is_leap(year) else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31
''',
            [(2, 2024), (2, 2023), (4, 2023), (1, 2023), (12, 2000), (9, 1999), (2, 1900), (6, 2020)],
            ("is_leap",),
        ),
        _fn(
            "day_of_year",
            '''
def day_of_year(day, month, year):
    """Ordinal day of the year: 1 January is day 1."""
    total = day
    for m in range(1, month):
        total += days_in_month(m, year)
    return total
''',
            [(1, 1, 2023), (1, 3, 2024), (1, 3, 2023), (31, 12, 2023), (15, 2, 2020), (31, 12, 2024)],
            ("days_in_month", "is_leap"),
        ),
        _fn(
            "quarter",
            '''
def quarter(month):
    """The quarter (1-4) month (1-12) falls in."""
    return (month - 1) // 3 + 1
''',
            [(1,), (3,), (4,), (6,), (7,), (12,), (10,)],
        ),
        _fn(
            "weekday_name",
            '''
def weekday_name(index):
    """Name of weekday index 0-6 (0 = Monday); '?' for anything else."""
    names = ['Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday', 'Sunday']
    if index < 0 or index > 6:
        return '?'
    return names[index]
''',
            [(0,), (6,), (3,), (7,), (-1,), (5,)],
        ),
    ],
    "pricing": [
        _fn(
            "apply_discount",
            '''
def apply_discount(price, percent):
    """price reduced by percent (0-100), to the cent."""
    if percent <= 0:
        return price
    if percent >= 100:
        return 0.0
    return round(price * (100 - percent) / 100, 2)
''',
            [(100.0, 10), (80.0, 0), (50.0, 100), (19.99, 25), (10.0, -5), (200.0, 150), (9.5, 50)],
        ),
        _fn(
            "shipping_cost",
            '''
def shipping_cost(weight):
    """Shipping for a parcel of weight kg: free for nothing, flat rates up to 5 kg, then 1.5 per extra kg."""
    if weight <= 0:
        return 0.0
    if weight < 1:
        return 4.5
    if weight < 5:
        return 7.0
    return 7.0 + (weight - 5) * 1.5
''',
            [(0,), (0.5,), (1,), (4.9,), (5,), (9,), (-2,), (12,)],
        ),
        _fn(
            "with_tax",
            '''
def with_tax(amount, rate):
    """amount plus tax at rate (0.2 = 20 %), to the cent."""
    return round(amount * (1 + rate), 2)
''',
            [(100.0, 0.2), (50.0, 0.0), (19.99, 0.07), (0.0, 0.5), (10.0, 0.25)],
        ),
        _fn(
            "bulk_price",
            '''
def bulk_price(unit, qty):
    """unit * qty, 10 % off from 10 items, to the cent."""
    total = unit * qty
    if qty >= 10:
        total = total * 0.9
    return round(total, 2)
''',
            [(2.0, 5), (2.0, 10), (3.5, 12), (1.0, 9), (4.0, 0), (0.99, 100)],
        ),
        _fn(
            "split_bill",
            '''
def split_bill(total, people):
    """Each person's share of total, to the cent; the whole total for fewer than 2 people."""
    if people < 2:
        return total
    return round(total / people, 2)
''',
            [(100.0, 4), (10.0, 3), (50.0, 1), (50.0, 0), (99.0, 2)],
        ),
    ],
    "grades": [
        _fn(
            "letter",
            '''
def letter(score):
    """Letter grade of a 0-100 score: A from 90, B from 80, C from 70, D from 60, else F."""
    if score >= 90:
        return 'A'
    if score >= 80:
        return 'B'
    if score >= 70:
        return 'C'
    if score >= 60:
        return 'D'
    return 'F'
''',
            [(95,), (90,), (89,), (80,), (75,), (70,), (65,), (60,), (59,), (0,)],
        ),
        _fn(
            "passed",
            '''
def passed(scores, cutoff):
    """The scores at or above cutoff, in order."""
    return [s for s in scores if s >= cutoff]
''',
            [([50, 60, 70], 60), ([], 50), ([10, 20], 30), ([60, 60], 60), ([99, 1, 50], 50)],
        ),
        _fn(
            "top_n",
            '''
def top_n(scores, n):
    """The n highest scores, highest first."""
    return sorted(scores, reverse=True)[:n]
''',
            [([3, 9, 5, 1], 2), ([], 3), ([4, 4, 2], 1), ([1, 2, 3], 5), ([7, 3, 9], 0)],
        ),
        _fn(
            "curve",
            '''
def curve(scores, points):
    """Every score raised by points, capped at 100."""
    return [min(100, s + points) for s in scores]
''',
            [([50, 95, 80], 10), ([], 5), ([100], 1), ([0, 99], 1), ([70], 0)],
        ),
        _fn(
            "grade_counts",
            '''
def grade_counts(scores):
    """How many scores got each letter, as a dict."""
    counts = {}
    for s in scores:
        g = letter(s)
        counts[g] = counts.get(g, 0) + 1
    return counts
''',
            [([95, 85, 91],), ([],), ([50, 60, 70, 80, 90],), ([59, 59],)],
            ("letter",),
        ),
    ],
}
