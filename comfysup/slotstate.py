"""The supervisor's state file, ``<queue folder>/supervisor.json``: written when what it says changes (looked at
every loop tick), read by people.

``comfysup status`` and ``comfysup health`` read it instead of asking the supervisor, so they work with
no endpoint and say plainly when the file is stale (the supervisor is not running).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from comfysup.config import Config
from comfysup.records import Record


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 checks without sending; one we may not signal exists too).
    Not psutil's: importing it was a tenth of `comfysup status`'s start-up, for this one question."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

STATE_FILE = "supervisor.json"
WORK_FILE = "work.json"
"""``comfysup work``'s own state file: its servers and whether each is in service (it has no supervisor)."""
STALE_SECONDS = 10.0
"""The supervisor rewrites the file at least every REFRESH_SECONDS; older than this, it has stopped or hangs."""
REFRESH_SECONDS = 2.0
"""A state file whose content has not changed is written again this often, only for its ``updated_at``."""


class StateFile:
    """One process's state file, written atomically (a reader never sees half of it, or a mix of two) when what
    it says changes, and every REFRESH_SECONDS otherwise: its ``updated_at`` tells a reader that the writer lives
    (STALE_SECONDS). The supervisor and ``comfysup work`` look every tick; writing the same file again at each of
    ``work``'s four ticks a second (a rename and a folder entry each) was most of its own CPU while its runners
    followed prompts of a second or less (bench/real.py, the realistic cell: 1.3-1.8 ms a job of that process)."""

    def __init__(self, path: Path, *, indent: int | None = 1, clock: Any = time.monotonic) -> None:
        self.path = path
        self.indent = indent
        self.clock = clock
        self._written: dict[str, Any] | None = None
        self._written_at = 0.0

    def write(self, snapshot: dict[str, Any], *, force: bool = False) -> bool:
        """Write ``snapshot`` unless it says what the file says and was written less than REFRESH_SECONDS ago
        (``updated_at`` aside); ``force``: write it anyway (a final state). Returns whether it wrote; OSError when
        it could not (the caller says so; the next call writes again)."""
        said = {k: v for k, v in snapshot.items() if k != "updated_at"}
        now = self.clock()
        if not force and said == self._written and now - self._written_at < REFRESH_SECONDS:
            return False
        try:
            write_whole(self.path, snapshot, self.indent)
        except OSError:
            self._written = None  # unknown now: written again at the next call
            raise
        self._written, self._written_at = said, now
        return True


def write_whole(path: Path, state: dict[str, Any], indent: int | None = None) -> None:
    """``state`` as JSON in ``path``, atomically: a temporary file renamed over it (a reader never sees half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=indent))
    os.replace(tmp, path)


def state_path(config: Config) -> Path:
    return config.resolve(config.queue.path).parent.absolute() / STATE_FILE


def read_state(config: Config) -> dict[str, Any] | None:
    """The last state written, or None when there is none (never ran here) or it cannot be read."""
    try:
        data = json.loads(state_path(config).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("slots"), list) else None


def staleness(state: dict[str, Any], now: float | None = None) -> str | None:
    """None while the supervisor is running; otherwise why the file should not be believed."""
    now = time.time() if now is None else now
    age = now - float(state.get("updated_at") or 0)
    if state.get("state") == "stopped":
        return f"the supervisor stopped {age:.0f} s ago"
    pid = state.get("pid")
    if not isinstance(pid, int) or not pid_exists(pid):
        return f"the supervisor (pid {pid}) is not running; last update {age:.0f} s ago"
    if age > STALE_SECONDS:
        return f"no update for {age:.0f} s: the supervisor (pid {pid}) may hang"
    return None


def work_state_path(config: Config) -> Path:
    return config.resolve(config.queue.path).parent.absolute() / WORK_FILE


def read_work_state(config: Config) -> dict[str, Any] | None:
    """What ``comfysup work`` last wrote of its servers (None: none); believe it only while ``staleness``
    says None."""
    try:
        data = json.loads(work_state_path(config).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("slots"), list) else None


BROKER_FILE = "broker.json"
"""The RabbitMQ consumer's own state (comfysup.broker): connection, unacknowledged messages, counts."""


def broker_state_path(config: Config) -> Path:
    return config.resolve(config.queue.path).parent.absolute() / BROKER_FILE


def write_broker_state(config: Config, state: dict[str, Any]) -> None:
    """Atomically (a reader never sees half a file); a folder that cannot be written is not fatal. The consumer
    says when (comfysup.broker.consumer ``write_state``): every write here is made."""
    with contextlib.suppress(OSError):
        write_whole(broker_state_path(config), state)


def read_broker_state(config: Config) -> dict[str, Any] | None:
    """The consumer's last state, with ``stale`` set when its process is gone or has not written lately."""
    try:
        data = json.loads(broker_state_path(config).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    pid, age = data.get("pid"), time.time() - float(data.get("updated_at") or 0)
    if not isinstance(pid, int) or not pid_exists(pid):
        data["stale"] = f"the consumer (pid {pid}) is not running; last update {age:.0f} s ago"
    elif age > STALE_SECONDS:
        data["stale"] = f"no update for {age:.0f} s: the consumer (pid {pid}) may hang"
    return data


class Readiness(Record):
    """GET /ready's answer (the API's and the status server's): whether a load balancer should send work here."""

    ready: bool
    reason: str
    ready_slots: int
    queued: int

    def body(self) -> dict[str, Any]:
        return {"status": "ready" if self.ready else "not_ready", "reason": self.reason,
                "ready_slots": self.ready_slots, "queued_jobs": self.queued}


def ready_slots(state: dict[str, Any] | None, now: float | None = None) -> int:
    """Slots of a running supervisor that take jobs now (its server answers and is warm, its runner runs)."""
    if state is None or staleness(state, now) is not None:
        return 0
    return sum(1 for slot in state.get("slots") or [] if isinstance(slot, dict) and slot.get("ready"))


def readiness(state: dict[str, Any] | None, queued: int, max_per_slot: float, now: float | None = None) -> Readiness:
    """Not ready until a slot is warm, nor while the staging folder is full ([store] staging_max_gb: no runner
    claims), nor while the queued jobs per ready slot exceed ``max_per_slot`` (``[api] ready_max_queue_per_slot``;
    0: no bound). Pure: the caller reads the state file and the queue."""
    if state is None:
        return Readiness(False, "no supervisor state here: comfysup run is not running on this machine", 0, queued)
    stale = staleness(state, now)
    if stale is not None:
        return Readiness(False, stale, 0, queued)
    ready = ready_slots(state, now)
    staging = state.get("staging")
    if isinstance(staging, dict) and staging.get("full"):  # no runner claims: outputs wait for the bucket
        return Readiness(False, str(staging.get("reason") or "the staging folder is full"), ready, queued)
    if not ready:
        slots = [s for s in state.get("slots") or [] if isinstance(s, dict)]
        what = ", ".join(f"{s.get('name')}: {'warming up' if s.get('warming') else s.get('state')}" for s in slots[:8])
        return Readiness(False, f"no slot is ready yet ({what or 'no slot'})", 0, queued)
    if max_per_slot and queued / ready > max_per_slot:
        return Readiness(False, f"{queued} queued job(s) for {ready} ready slot(s): above [api] "
                         f"ready_max_queue_per_slot = {max_per_slot:g}", ready, queued)
    return Readiness(True, f"{ready} ready slot(s), {queued} queued job(s)", ready, queued)


MEMORY_NOTES = (("oom_frees", "OOM /free"), ("oom_retries", "OOM retried"), ("device_restarts", "device restarts"),
                ("idle_frees", "idle /free"), ("idle_restarts", "idle restarts"))


def warmup_cell(slot: dict[str, Any]) -> str:
    """A slot's warm-up as status and the page show it: ``warming``, the last one's duration, or ``-``."""
    if slot.get("warming"):
        return "warming"
    seconds = slot.get("warmup_seconds")
    failed = int(slot.get("warmup_failures") or 0)
    text = f"{seconds:.1f} s" if isinstance(seconds, int | float) else "-"
    return f"{text} ({failed} failed)" if failed else text


def memory_note(slot: dict[str, Any]) -> str:
    """The slot's memory recoveries that happened (``OOM /free 2, OOM retried 2``), or ""."""
    return ", ".join(f"{what} {int(slot.get(key) or 0)}" for key, what in MEMORY_NOTES if slot.get(key))
