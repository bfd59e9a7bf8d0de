def truncate(text: str, width: int, suffix: str = "...") -> str:
    """Cut `text` to at most `width` characters, ending in `suffix` when something was cut."""
    if len(text) <= width:
        return text
    if width <= len(suffix):
        return suffix[:width]
    return text[: width - len(suffix)].rstrip() + suffix


def wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap into lines of at most `width` characters (a longer word gets a line of its own)."""
    lines, line = [], ""
    for word in text.split():
        if not line:
            line = word
        elif len(line) + 1 + len(word) <= width:
            line += " " + word
        else:
            lines.append(line)
            line = word
    if line:
        lines.append(line)
    return lines
