import re

UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)\s*([dhms])", re.IGNORECASE)


def parse_duration(text: str) -> int:
    """'1h30m' -> 5400 seconds; units d, h, m, s in any case, optionally separated by spaces."""
    text = text.strip()
    pos, total = 0, 0
    for m in _PART.finditer(text):
        if text[pos : m.start()].strip():
            raise ValueError(f"bad duration {text!r}")
        total += int(m.group(1)) * UNITS[m.group(2).lower()]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise ValueError(f"bad duration {text!r}")
    return total


def format_duration(seconds: int) -> str:
    """5400 -> '1h 30m'; days are used above 24 hours; zero parts are left out; 0 -> '0s'."""
    if seconds < 0:
        raise ValueError("negative duration")
    parts = []
    for unit, size in UNITS.items():
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return " ".join(parts) or "0s"
