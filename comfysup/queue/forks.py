"""The fork registry: no queue connection is used across ``os.fork``, and none is half-way through a transaction
there. Fork waits for each live queue's running transaction (its lock), then each backend readies itself
(``_drop_for_fork``); in the child every queue abandons what it inherited (``_abandon``).
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from comfysup.queue.db import SQLDb

_LIVE: weakref.WeakSet[SQLDb] = weakref.WeakSet()
_FORKING: list[SQLDb] = []


def register(queue: SQLDb) -> None:
    """A queue of this process, readied for every fork from now on."""
    _LIVE.add(queue)


def _before_fork() -> None:
    """Fork waits for each queue's running transaction, then each backend readies itself (``_drop_for_fork``)."""
    for queue in list(_LIVE):
        queue._lock.acquire()
        _FORKING.append(queue)
        queue._drop_for_fork()


def _after_fork_in_parent() -> None:
    while _FORKING:
        _FORKING.pop()._lock.release()


def _after_fork_in_child() -> None:
    while _FORKING:
        queue = _FORKING.pop()
        queue._abandon()
        queue._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)
