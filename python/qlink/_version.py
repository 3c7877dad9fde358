"""qlink's version, written here only: qlink.__version__, `qlink --version` and the wheel's
metadata (pyproject.toml reads this file) all report it, beside the C ABI version the
package speaks (plugin_api/qlink.h's QLINK_ABI_MAJOR/MINOR, mirrored in _abi.py)."""
__version__ = "0.1.0"
