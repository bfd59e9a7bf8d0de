"""confparse: an INI-style config parser with typed getters."""

from confparse.parser import get, parse
from confparse.values import to_bool, to_int, to_list

__all__ = ["get", "parse", "to_bool", "to_int", "to_list"]
__version__ = "0.9.0"
