"""csvlite: a tiny CSV reader and writer."""

from csvlite.reader import read_rows, split_line
from csvlite.writer import quote_field, write_rows

__all__ = ["read_rows", "split_line", "quote_field", "write_rows"]
__version__ = "0.2.0"
