def quote_field(value, delim: str = ",") -> str:
    """A field as CSV text: quoted when it holds the delimiter, a quote or a line break."""
    s = "" if value is None else str(value)
    if any(c in s for c in (delim, '"', "\n", "\r")):
        return '"' + s.replace('"', '""') + '"'
    return s


def write_rows(rows: list[dict], columns: list[str], delim: str = ",") -> str:
    lines = [delim.join(quote_field(c, delim) for c in columns)]
    for row in rows:
        lines.append(delim.join(quote_field(row.get(c), delim) for c in columns))
    return "\n".join(lines) + "\n"
