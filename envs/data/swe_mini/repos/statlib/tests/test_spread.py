import pytest
from statlib import value_range, variance


def test_variance_population():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 4


def test_variance_needs_data():
    with pytest.raises(ValueError):
        variance([1])


def test_value_range():
    assert value_range([3, 9, 1]) == 8
