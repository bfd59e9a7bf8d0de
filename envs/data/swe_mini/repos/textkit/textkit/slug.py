import re
import unicodedata


def slugify(text: str, sep: str = "-") -> str:
    """'Hello, World!' -> 'hello-world'. Accents are dropped ('Café' -> 'cafe')."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-z0-9]+", sep, text.lower())
    return text.strip(sep)
