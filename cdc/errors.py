"""One error tree for the whole framework. Every error says whether retrying can help.

    CdcError                      retriable: bool (class attribute, may be overridden per instance)
    ├── RetriableError            the same call may succeed later (network, broker, lock timeout)
    └── PermanentError            retrying cannot help until something is changed
        └── DevStackError         the local stack of servers could not be set up or started

Code that catches errors decides on ``err.retriable``, never on message text.
"""

from __future__ import annotations


class CdcError(Exception):
    retriable: bool = False

    def __init__(self, message: str, *, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class RetriableError(CdcError):
    retriable = True


class PermanentError(CdcError):
    retriable = False


class DevStackError(PermanentError):
    """A server of the local stack could not be installed, started or reached."""
