def split_line(line: str, delim: str = ",") -> list[str]:
    """Split one CSV line; fields may be quoted with '"', and '""' inside quotes is a literal quote."""
    fields, buf, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and line[i + 1 : i + 2] == '"':
                buf.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                buf.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == delim:
            fields.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    fields.append("".join(buf))
    return fields


def read_rows(text: str, delim: str = ",") -> list[dict]:
    """Rows as dicts keyed by the header line; blank lines are skipped and header names stripped."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [h.strip() for h in split_line(lines[0], delim)]
    rows = []
    for n, line in enumerate(lines[1:], 2):
        values = split_line(line, delim)
        if len(values) != len(header):
            raise ValueError(f"line {n}: expected {len(header)} fields, got {len(values)}")
        rows.append(dict(zip(header, values)))
    return rows
