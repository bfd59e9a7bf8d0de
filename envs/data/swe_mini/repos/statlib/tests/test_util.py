import pytest
from statlib import clamp, percent_change, round_half_up


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_outside():
    assert clamp(-3, 0, 10) == 0 and clamp(12, 0, 10) == 10


def test_round_half_up_plain():
    assert round_half_up(2.4) == 2 and round_half_up(2.6) == 3


def test_percent_change():
    assert percent_change(50, 75) == 50


def test_percent_change_from_zero():
    with pytest.raises(ValueError):
        percent_change(0, 5)
