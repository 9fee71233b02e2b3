"""One exception base for everything a person should read instead of a traceback.

Like procrastinate's errors, the message defaults to the class docstring, so a raise site only adds
what it knows (the file, the key, the id) and the CLI prints ``str(exc)`` and exits with ``exit_code``.
"""

from __future__ import annotations


class ComfysupError(Exception):
    """comfysup failed."""

    exit_code = 1

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(ComfysupError):
    """The configuration is invalid."""

    exit_code = 2


class UsageError(ComfysupError):
    """The command line is invalid."""

    exit_code = 2


class QueueError(ComfysupError):
    """The queue cannot be used."""


class DatabaseMissing(QueueError):
    """The queue database does not exist yet: submit jobs first, or check [queue] path."""


class DatabaseCorrupt(QueueError):
    """The queue database fails its integrity check (SQLite: SQLITE_CORRUPT or SQLITE_NOTADB): restore it from a
    backup, or move it away. Exit code 75, as a process whose queue file was lost under it (comfysup.queue.watch)."""

    exit_code = 75


class QueueUnavailable(QueueError):
    """The queue database cannot be used for now (locked beyond the wait allowed, or not answering); it may answer
    again by itself, and every process that holds a connection opens a new one when it does. ``maybe_stored``: the
    failure came while a commit was sent, so what it wrote may or may not have been made."""

    def __init__(self, message: str | None = None, *, maybe_stored: bool = False) -> None:
        super().__init__(message)
        self.maybe_stored = maybe_stored


class DatabaseLocked(QueueUnavailable):
    """The queue database stayed locked beyond the busy timeout: another process holds a write lock."""


class LeaseLost(QueueError):
    """This runner's claim on the job is gone (expired and taken, released, or cancelled); stop without writing."""


class NotFound(QueueError):
    """No job has this id."""


class DatabaseUnavailable(QueueUnavailable):
    """The queue database does not answer (server down, network lost, connection refused)."""
