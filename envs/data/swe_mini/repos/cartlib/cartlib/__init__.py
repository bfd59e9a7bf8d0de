"""cartlib: shopping-cart arithmetic in integer cents."""

from cartlib.cart import Cart
from cartlib.discount import apply_discount, parse_coupon
from cartlib.money import format_money, parse_money

__all__ = ["Cart", "apply_discount", "parse_coupon", "format_money", "parse_money"]
__version__ = "2.0.3"
