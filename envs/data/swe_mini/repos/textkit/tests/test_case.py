from textkit import camel_case, snake_case, title_case


def test_snake_case_camel():
    assert snake_case("HelloWorld") == "hello_world"


def test_snake_case_spaces():
    assert snake_case("hello big world") == "hello_big_world"


def test_camel_case_basic():
    assert camel_case("hello_world") == "helloWorld"


def test_camel_case_empty():
    assert camel_case("") == ""


def test_title_case_small_words():
    assert title_case("the lord of the rings") == "The Lord of the Rings"
