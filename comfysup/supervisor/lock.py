"""The files a supervisor holds: its lock (one ``comfysup run`` per queue folder on a machine), and its queue's
file, watched (comfysup.queue.watch): deleted, replaced or failing its integrity check under the supervisor or
any of its children, everyone stops and the supervisor exits with EXIT_DATABASE_REPLACED."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from comfysup.errors import ComfysupError
from comfysup.queue.watch import EXIT_DATABASE_REPLACED, QueueWatch, lost_line

LOCK_FILE = "supervisor.lock"
__all__ = ["EXIT_DATABASE_REPLACED", "AlreadyRunning", "queue_lost", "take_lock"]


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


def queue_lost(watch: QueueWatch | None, status: int | None = None, child: str = "") -> str | None:
    """The line that says why everyone stops: the watch's reason, or a ``child`` that exited with
    EXIT_DATABASE_REPLACED (its watch found the file lost: a deep look here says how); None while neither."""
    reason = watch.check() if watch is not None else None
    if reason is None and status is not None and os.WIFEXITED(status) \
            and os.WEXITSTATUS(status) == EXIT_DATABASE_REPLACED:
        reason = (watch.look_deep() if watch is not None else None) or (
            f"was found deleted, replaced or failing its integrity check by the {child} (its log says how)")
    if reason is None:
        return None
    return f"{lost_line(reason)}. Stopping now (exit code {EXIT_DATABASE_REPLACED})"
