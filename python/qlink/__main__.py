"""`python3 -m qlink ...`: the same as the `qlink` command (qlink.cli)."""
import sys

from .cli import main

sys.exit(main())
