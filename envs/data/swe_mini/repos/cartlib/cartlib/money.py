def format_money(cents: int) -> str:
    """1234550 -> '$12,345.50'; negative amounts as '-$1.50'."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars:,}.{rest:02d}"


def parse_money(text: str) -> int:
    """'$12,345.50' -> 1234550 cents; '-$1.5' -> -150."""
    s = text.strip().replace(",", "")
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("-").lstrip("$")
    whole, _, frac = s.partition(".")
    if not (whole.isdigit() or (whole == "" and frac)):
        raise ValueError(f"not an amount: {text!r}")
    if frac and (not frac.isdigit() or len(frac) > 2):
        raise ValueError(f"not an amount: {text!r}")
    return sign * (int(whole or 0) * 100 + int(frac.ljust(2, "0") or 0))
