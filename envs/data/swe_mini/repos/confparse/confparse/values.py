TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


def to_bool(s: str) -> bool:
    """'yes'/'on'/'true'/'1' and 'no'/'off'/'false'/'0' in any case; anything else is an error."""
    v = s.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise ValueError(f"not a boolean: {s!r}")


def to_int(s: str) -> int:
    """Decimal, or hex/octal/binary with 0x/0o/0b; '_' separators allowed."""
    return int(s.strip(), 0)


def to_list(s: str, sep: str = ",") -> list[str]:
    """'a, b,,c,' -> ['a', 'b', 'c']: items stripped, empty items dropped."""
    return [x.strip() for x in s.split(sep) if x.strip()]
