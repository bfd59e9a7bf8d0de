import pytest
from cartlib import Cart


def test_add_and_total():
    cart = Cart()
    cart.add("pen", 150, 2)
    cart.add("pad", 300)
    assert cart.total() == 600 and cart.count() == 3


def test_remove_some():
    cart = Cart()
    cart.add("pen", 150, 3)
    cart.remove("pen")
    assert cart.items["pen"] == (150, 2)


def test_remove_unknown():
    with pytest.raises(KeyError):
        Cart().remove("ghost")


def test_total_with_discount():
    cart = Cart()
    cart.add("pen", 999)
    assert cart.total(10) == 899
