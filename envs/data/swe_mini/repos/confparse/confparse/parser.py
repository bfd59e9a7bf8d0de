from confparse.values import to_bool, to_int, to_list

_CONVERTERS = {"str": str, "bool": to_bool, "int": to_int, "list": to_list}


def _strip_comment(line: str) -> str:
    """Drop a '#' or ';' comment: a whole-line one, or an inline one that follows whitespace."""
    s = line.strip()
    if s.startswith(("#", ";")):
        return ""
    for mark in (" #", " ;", "\t#", "\t;"):
        if mark in s:
            s = s[: s.index(mark)]
    return s.strip()


def parse(text: str) -> dict:
    """INI text -> {section: {key: value}}; keys before any section go to "DEFAULT"; keys are lower-cased."""
    data: dict = {}
    section = "DEFAULT"
    for n, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ValueError(f"line {n}: expected 'key = value'")
        key, value = line.split("=", 1)
        data.setdefault(section, {})[key.strip().lower()] = value.strip()
    return data


def get(data: dict, section: str, key: str, type: str = "str", default=None):
    """A typed value: type is one of str, bool, int, list."""
    raw = data.get(section, {}).get(key.lower())
    if raw is None:
        return default
    return _CONVERTERS[type](raw)
