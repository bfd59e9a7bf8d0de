from confparse import get, parse

TEXT = """
# settings
name = demo
[server]
port = 8080
debug = off
"""


def test_parse_sections():
    data = parse(TEXT)
    assert data["DEFAULT"]["name"] == "demo" and data["server"]["port"] == "8080"


def test_get_typed():
    data = parse(TEXT)
    assert get(data, "server", "port", "int") == 8080 and get(data, "server", "debug", "bool") is False


def test_get_default():
    assert get(parse(TEXT), "server", "missing", default=3) == 3
