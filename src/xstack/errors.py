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
