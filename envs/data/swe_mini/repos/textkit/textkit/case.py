import re

SMALL_WORDS = {"a", "an", "and", "the", "of", "in", "on", "or", "to"}


def snake_case(text: str) -> str:
    """'HelloWorld' -> 'hello_world', 'hello world' -> 'hello_world'."""
    text = re.sub(r"[\s\-]+", "_", text.strip())
    text = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", text)
    return text.lower()


def camel_case(text: str) -> str:
    """'hello_world' -> 'helloWorld'. Empty parts (double, leading or trailing underscores) are ignored."""
    parts = [p for p in re.split(r"[_\s\-]+", text) if p]
    if not parts:
        return ""
    return parts[0].lower() + "".join(p[0].upper() + p[1:].lower() for p in parts[1:])


def title_case(text: str) -> str:
    """Capitalise every word but small ones; the first and the last word are always capitalised."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        if 0 < i < len(words) - 1 and word.lower() in SMALL_WORDS:
            out.append(word.lower())
        else:
            out.append(word[:1].upper() + word[1:].lower())
    return " ".join(out)
