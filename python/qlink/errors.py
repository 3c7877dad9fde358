"""Exceptions carrying the plugin's status and its per-thread message."""
from . import _abi


class QlinkError(RuntimeError):
    """A failed qlink call. `status` is the qlink_status code; str() is the plugin's message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(QlinkError, ValueError):
    """An argument, config field or tensor was refused; nothing was changed."""


class UnavailableError(QlinkError):
    """The backend, a device or a peer path cannot serve the call."""


class VersionMismatchError(QlinkError):
    """The plugin does not provide the ABI this package was written against."""


_BY_STATUS = {
    _abi.INVALID_ARGUMENT: InvalidArgumentError,
    _abi.UNAVAILABLE: UnavailableError,
    _abi.VERSION_MISMATCH: VersionMismatchError,
}


def error_for(status, message):
    return _BY_STATUS.get(status, QlinkError)(status, message)
