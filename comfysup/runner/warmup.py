"""The warm-up (``[comfyui] warmup``): a workflow each launched server runs after every start, before its
slot takes a job, so the first job does not pay for loading models and compiling kernels (a cold first job of a
real SDXL server takes three times a warm one's time).

The supervisor asks for it (its slot's shared block: ``warm_wanted``, the server's start number) once the
server answers GET /system_stats, and keeps the server ``starting`` until the runner says it is over
(``warm_done``, ``warm_ms``, ``warm_error``): the runner holds the server's client and is idle then (it may
not claim while its server starts), and the supervisor's loop must not block on a prompt. A warm-up that
fails is a failed start, which the server's restart policy counts (comfysup.supervisor.policy).

The warm-up is posted under a prompt id of its own (never a job's) and followed through /history; its files, if
it saves any, stay in the server's output folder (a PreviewImage saves nothing there).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comfysup.comfy import CLIENT_PREFIX, ComfyClient, ComfyError, deadline
from comfysup.comfy.history import judge
from comfysup.config import Config
from comfysup.errors import ConfigError
from comfysup.jobs.graph import check_api_format
from comfysup.jobs.values import JobLineError

log = logging.getLogger("comfysup.runner")

POLL_SECONDS = (0.05, 0.5)
"""The first and the longest wait between two reads of the warm-up's /history entry."""


def load(config: Config) -> dict[str, Any] | None:
    """``[comfyui] warmup``'s workflow, read and checked before anything starts; None when none is set."""
    name = config.comfyui.warmup
    if not name:
        return None
    path = config.resolve(name)
    where = f"{config.source}: [comfyui] warmup = {name!r}"
    try:
        workflow = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file ({Path(path).absolute()}); point it at an API-format "
                          "workflow, or set warmup = \"\"") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON: {exc}") from None
    try:
        check_api_format(workflow, "the warm-up workflow")
    except JobLineError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return workflow


def run(client: ComfyClient, workflow: dict[str, Any], timeout_seconds: float, alive: Callable[[], None],
        stopped: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> float:
    """Post the warm-up and wait for its end; its duration in seconds. Raises ComfyError when it failed (a
    rejection, an execution_error, no end within ``timeout_seconds``, a server that went away)."""
    start = clock()
    prompt_id = str(uuid.uuid4())
    client.post_prompt(workflow, prompt_id, f"{CLIENT_PREFIX}warmup-{uuid.uuid4().hex[:8]}")
    wait = POLL_SECONDS[0]
    while True:
        alive()
        entry = client.history(prompt_id)
        if entry is not None:
            judge(entry)  # raises on an execution_error or an interruption
            return clock() - start
        if stopped():
            raise ComfyError("the runner is stopping", "shutdown")
        if clock() - start >= timeout_seconds:
            raise ComfyError(f"no end within [comfyui] warmup_timeout_seconds = {timeout_seconds:g}", "timeout")
        time.sleep(wait)
        wait = min(wait * 2, POLL_SECONDS[1])


@dataclass
class WarmUp:
    """A runner's side of the warm-up: which start of its server wants one (``wanted()``, 0: none), and where
    to say that it is over (``over(start, milliseconds, error)``)."""

    workflow: dict[str, Any]
    timeout_seconds: float
    wanted: Callable[[], int]
    over: Callable[[int, int, str], None]
    done: int = field(default=0)

    def due(self) -> int:
        """The server start whose warm-up is asked and not run yet (0: nothing to do)."""
        start = self.wanted()
        return start if start and start != self.done else 0

    def step(self, server: str, client: ComfyClient, alive: Callable[[], None], stopped: Callable[[], bool]) -> None:
        """Run the warm-up when one is due, and report it (errors included: the supervisor decides)."""
        start = self.due()
        if not start:
            return
        self.done = start
        error = ""
        began = time.monotonic()
        try:
            seconds = run(client, self.workflow, self.timeout_seconds, alive, stopped)
        except (ComfyError, deadline.DeadlineExceeded) as exc:
            seconds = time.monotonic() - began
            error = str(getattr(exc, "reason", None) or exc)[:230]
            log.debug("%s: warm-up failed after %.1f s: %s", server, seconds, error, extra={"event": "warmup"})
        else:  # the supervisor says it to people, once (comfysup.supervisor.warming)
            log.debug("%s: warm-up done in %.2f s", server, seconds, extra={"event": "warmup"})
        self.over(start, round(seconds * 1000), error)
