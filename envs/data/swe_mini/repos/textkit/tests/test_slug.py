from textkit import slugify


def test_slugify_simple():
    assert slugify("Hello World") == "hello-world"


def test_slugify_accents():
    assert slugify("Caf\u00e9 au lait") == "cafe-au-lait"


def test_slugify_custom_sep():
    assert slugify("a b c", sep="_") == "a_b_c"
