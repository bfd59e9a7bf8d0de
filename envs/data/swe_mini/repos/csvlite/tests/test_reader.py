import pytest
from csvlite import read_rows, split_line


def test_split_plain():
    assert split_line("a,b,c") == ["a", "b", "c"]


def test_split_quoted_delimiter():
    assert split_line('a,"b,c",d') == ["a", "b,c", "d"]


def test_read_rows():
    assert read_rows("name,age\nAnn,31\n") == [{"name": "Ann", "age": "31"}]


def test_read_rows_wrong_width():
    with pytest.raises(ValueError):
        read_rows("a,b\n1,2,3")
