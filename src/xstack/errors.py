"""The one error hierarchy of xstack: every failure a user should see is an ``XstackError``."""

from __future__ import annotations


class XstackError(Exception):
    """Base of every error xstack raises on purpose; the CLI prints its message and exits 1."""


class UsageError(XstackError):
    """The command line or API was called wrongly (exit code 2)."""


class BadInputError(XstackError):
    """An input file is missing, unreadable or not what it claims to be; the message names the file."""


class StoreError(XstackError):
    """A trace store cannot be opened or written (foreign file, other schema version, ...)."""


class ProgramFailedError(XstackError):
    """The profiled program failed before anything of it was recorded: the CLI prints the message and exits with
    the program's own code (``code``), as it does for a program whose profile was kept."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code
