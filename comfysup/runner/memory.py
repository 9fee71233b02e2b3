"""Memory recovery after an ``execution_error``: what a runner does about its server's device.

- Out of memory: ComfyUI has already unloaded its models (model_management after an OOM), but the CUDA cache
  and a fragmented allocator may still hold the memory the next run needs. The attempt asks the server to
  ``POST /free`` (``unload_models``, ``free_memory``: applied by ComfyUI's worker once it is idle) and posts
  the job once more on the same server, in the same attempt and without counting one: the first run is known
  to have ended (its execution_error), so nothing runs twice at once. With a job queued behind it, the job
  goes back to the queue at once, uncounted, instead (see :func:`after_oom`). A second OOM takes the normal
  retry path (a counted, transient failure with its backoff).
- A lost device (an illegal memory access, a device-side assert, a GPU fallen off the bus: every later kernel
  of that process fails the same way) makes the runner ask its supervisor to restart the server
  (``MemoryHooks.restart``); the attempt fails transiently, and the runner claims nothing until the server is
  back. ``comfysup work`` has no one to restart a server: it logs what a person must do.

Each of these is counted (``MemoryHooks.count``: the slot's shared block under ``comfysup run``, shown by
``status``, the page and /metrics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from comfysup.comfy import ComfyError, deadline
from comfysup.comfy.errors import DEVICE_LOST

log = logging.getLogger("comfysup.runner")

OOM_KIND = "oom"
COUNTS = ("oom_frees", "oom_retries", "device_restarts")
"""What is counted: /free calls after an OOM, jobs posted again after one, restarts asked for a lost device."""


@dataclass
class MemoryHooks:
    """How a runner reaches whoever owns its server (the supervisor under ``comfysup run``)."""

    restarts: bool = False
    """Someone restarts the server when asked (``comfysup run``, a launched slot)."""
    restart: Callable[[str], None] = field(default=lambda reason: None)
    """Ask for the server's restart, with the reason (the runner claims nothing until it is back)."""
    count: Callable[[str], None] = field(default=lambda what: None)
    """One more of ``what`` (one of COUNTS)."""


POST_AGAIN = "post_again"
RELEASE = "release"
RELEASED_REASON = "out of memory; POST /free sent, and the job goes back to the queue without counting the attempt"
"""The reason of an OOM's uncounted release: the next attempt reads it in ``Claim.last_reason`` (not again)."""


def after_oom(kind: str, retried: bool, own_server: bool, queued_behind: bool) -> str | None:
    """What an attempt whose run just failed with ``kind`` does before the normal retry path (pure): None (take
    it), POST_AGAIN (POST /free, then post the job once more on this server in this attempt) or RELEASE (POST
    /free, then give the job back to the queue at once without counting the attempt).

    Only after an OOM, once per counted attempt (``retried``: already done in this attempt, or the attempt
    before was such a release), and on this runner's own server (a run caught up on a peer server is that
    server's). While a job of ours waits behind it in the server's queue, that job starts the moment the OOM
    ends this run, and a second run of this one would queue behind it, outside the order the jobs taken ahead keep:
    the job is released instead, to be claimed again (by this runner, after that job, unless another is
    quicker)."""
    if kind != OOM_KIND or retried or not own_server:
        return None
    return RELEASE if queued_behind else POST_AGAIN


def free(client_free: Callable[[], None], server: str, hooks: MemoryHooks) -> bool:
    """POST /free after an OOM (counted); False when the server did not take it (the job is then not posted
    again here: a server that cannot answer /free is no place for it now)."""
    try:
        client_free()
    except (ComfyError, deadline.DeadlineExceeded) as exc:
        log.warning("%s: POST /free after an out-of-memory error failed: %s", server,
                    getattr(exc, "reason", None) or exc, extra={"event": "oom_free"})
        return False
    hooks.count("oom_frees")
    return True


def device_lost(kind: str, reason: str, server: str, hooks: MemoryHooks) -> None:
    """After a failure of ``kind``: a lost device restarts the server (or says why nobody does)."""
    if kind != DEVICE_LOST:
        return
    if hooks.restarts:
        hooks.count("device_restarts")
        hooks.restart(f"the device is unusable after: {reason}"[:150])
        log.error("%s: %s; restarting its ComfyUI server", server, reason, extra={"event": "device_restart"})
    else:
        log.error("%s: %s; the device stays unusable until the server is restarted (it is not comfysup's to "
                  "restart)", server, reason, extra={"event": "device_lost"})
