"""Stand-in for the PCRE2 binding GPTQModel imports as `pcre`: Python's re, with pcre's
Flag names."""
import enum
import re
from re import *  # noqa: F401,F403
from re import Pattern, compile, escape, split  # noqa: F401


class Flag(enum.IntFlag):
    CASELESS = re.IGNORECASE
    MULTILINE = re.MULTILINE
    DOTALL = re.DOTALL
    VERBOSE = re.VERBOSE
