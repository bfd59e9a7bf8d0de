import re
from decimal import ROUND_HALF_UP, Decimal


def apply_discount(cents: int, percent) -> int:
    """`cents` minus `percent` %, rounded to the nearest cent (halves up); percent must be in 0..100."""
    if not 0 <= percent <= 100:
        raise ValueError(f"discount must be between 0 and 100, got {percent}")
    value = Decimal(cents) * (100 - Decimal(str(percent))) / 100
    return int(value.quantize(Decimal(1), rounding=ROUND_HALF_UP))


def parse_coupon(code: str) -> int:
    """'SAVE15' -> 15 (percent). Codes are case-insensitive and surrounding spaces are ignored."""
    m = re.fullmatch(r"SAVE(\d{1,2})", code.strip(), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"unknown coupon {code!r}")
    return int(m.group(1))
