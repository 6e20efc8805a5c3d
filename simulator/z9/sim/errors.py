"""The error type of the simulator's PVE API (:class:`PveError`), shared by every module."""

from __future__ import annotations


class PveError(Exception):
    """An error PVE reports: HTTP ``status``, ``message`` (reason phrase), optional param ``errors``."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def param_error(errors: dict[str, str]) -> PveError:
    """400 ``Parameter verification failed.`` with ``errors`` (PVE ``raise_param_exc``)."""
    return PveError(400, "Parameter verification failed.", errors)
