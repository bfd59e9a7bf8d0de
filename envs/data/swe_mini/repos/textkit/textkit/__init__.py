"""textkit: small text helpers."""

from textkit.case import camel_case, snake_case, title_case
from textkit.slug import slugify
from textkit.wrap import truncate, wrap

__version__ = "0.3.0"
__all__ = ["camel_case", "snake_case", "title_case", "slugify", "truncate", "wrap"]
