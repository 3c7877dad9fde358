from . import base, rtn, sign_round  # noqa: F401
