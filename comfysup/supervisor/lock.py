"""The files a supervisor holds: its lock (one ``comfysup run`` per queue folder on a machine), and the
exit status that says its queue file was deleted or replaced under it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO, Any

from comfysup.errors import ComfysupError, QueueError

LOCK_FILE = "supervisor.lock"
EXIT_DATABASE_REPLACED = 75
"""The exit status of a supervisor whose SQLite queue file was deleted or replaced under it (EX_TEMPFAIL):
its runners' writes went to the old file, so it kills them and exits; systemd's Restart=on-failure starts it
again on the file now at the path, and that one releases the claims of the runners that are gone."""


class AlreadyRunning(ComfysupError):
    """Another comfysup run uses this queue on this machine."""


def take_lock(state_dir: Path) -> IO[str]:
    """Lock ``state_dir/supervisor.lock`` for this process's life (two supervisors would fight over ports
    and each other's claims) and write our pid in it; returns the open file, which must stay open."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    handle = open(state_dir / LOCK_FILE, "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise AlreadyRunning(f"another comfysup run (pid {holder}) already supervises the queue in "
                             f"{state_dir}") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def database_replaced(queue: Any) -> str | None:
    """What happened to the queue's file when it is no longer the one open (``Queue.replaced``), else None
    (also when the database does not answer: that is the machine heartbeat's to say)."""
    try:
        return queue.replaced() if queue is not None else None
    except QueueError:
        return None
