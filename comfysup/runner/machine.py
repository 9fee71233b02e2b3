"""The protocol of one attempt's run, as a small pure state machine (the supervisor's Policy is its model).

The attempt's driver (comfysup.runner.driver) reads the socket, /history and the clocks, and feeds what it saw
here as events; :meth:`RunMachine.step` moves the run's :class:`Phase` and returns what to do as actions, which
the driver carries out (trace a message, read /history, renew the leases, interrupt the prompt, end the
attempt). Nothing here does I/O or reads a clock: every event carries its ``now``, so the whole protocol is
tested by feeding recorded ComfyUI message sequences and faults (tests/unit/test_run_machine.py).

What the protocol promises (docs/design.md "One attempt, step by step"):
- a run is this job's from its ``execution_start`` on; nothing before it, and no other prompt's message, is
  taken as this run's (a message of the job taken ahead is kept for that job's attempt);
- ``execution_success`` comes before ComfyUI writes the history, ``executing`` with node None right after it:
  /history is read at the second, or HISTORY_AFTER_SUCCESS_SECONDS after the first at most, and at once after
  a reconnection (nothing is replayed to a reconnected socket);
- a run whose every message from its start to its end was read on one connection needs no /history: its
  ``executed`` outputs are what the entry holds;
- an ``execution_error`` or an interrupt not asked for ends the run failed; a server that stays unreachable
  for ``server_lost_seconds`` is taken as dead;
- on the deadline, a cancel or the end of a stop's grace, the prompt is interrupted before the attempt ends.

Hot path: a message allocates its event and no action (the common answers are shared constants); a failure
allocates one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from comfysup.comfy.errors import execution_failure
from comfysup.runner.result import Ending

HISTORY_AFTER_SUCCESS_SECONDS = 0.05
"""The longest wait from a run's ``execution_success`` to its /history read, when its end is not read sooner."""


class Phase(enum.StrEnum):
    """Where an attempt's run is."""

    QUEUED = "queued"  # posted (or followed) in its server's queue; its execution_start not read yet
    EXECUTING = "executing"  # its execution_start read: it runs, and its messages are this run's
    SUCCEEDED = "succeeded"  # its execution_success read: ComfyUI writes its history entry now
    ENDED = "ended"  # its end read after its success (executing, node None): the history is written
    LEFT = "left"  # its end read without its success: an interrupt asked for, or a success lost in a reconnect


_QUEUED, _EXECUTING, _SUCCEEDED, _ENDED, _LEFT = Phase.QUEUED, Phase.EXECUTING, Phase.SUCCEEDED, Phase.ENDED, Phase.LEFT
"""The members as module names, for the code that runs at every message or wake-up: in Python 3.11 reading
``Phase.X`` goes through the enum's metaclass's ``__getattr__`` hook (a call and an allocation each time),
reading a module name does not."""


# -- events: what the driver saw (immutable values, tuples: the cheapest to make, one a message) ----------------

class Message(NamedTuple):
    """One message of the server's socket (``connection``: which connection read it; 0 for none)."""

    kind: str | None
    data: dict[str, Any]
    connection: int


class Reconnected(NamedTuple):
    """The socket dropped and was connected again with the same client id (or is being): messages are lost."""


class Woke(NamedTuple):
    """A wake-up of the follow loop (or a checkpoint of the download) at ``now``."""

    now: float
    heartbeat_due: bool = False
    stop_at: float | None = None
    """When a graceful stop's grace ends (None: no stop)."""
    ahead_unstarted: bool = False
    """A job taken ahead waits posted behind this run, its start not read."""
    connection: int = 0
    """The connection that reads now (0: none)."""
    every_output: bool = True
    """The server's messages carry every output (comfysup.comfyversion.tells_every_output)."""
    peer_waiting: bool = True
    """Another runner of this machine may wait for work (False: none does, so a job taken ahead is offered to
    nobody)."""


class Polled(NamedTuple):
    """/history was read at ``now``: ``found`` this run's entry, or not (not yet written, or still running)."""

    now: float
    found: bool


class Unreachable(NamedTuple):
    """/history (or /queue) could not be read at ``now``: the server does not answer."""

    now: float
    reason: str


class LeaseAnswer(NamedTuple):
    """The attempt's lease was renewed; ``cancelled``: a user asked to cancel the job."""

    cancelled: bool


class Over(NamedTuple):
    """This run's history entry was read (or made of its messages): the run is over on its server."""


Event = Message | Reconnected | Woke | Polled | Unreachable | LeaseAnswer | Over


# -- actions: what the driver does -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TraceIt:
    """Feed the message to the attempt's trace (and keep an ``executed`` output)."""


@dataclass(frozen=True, slots=True)
class KeepPreview:
    """A preview frame of this run, while it executes: the newest replaces the one held before."""


@dataclass(frozen=True, slots=True)
class OtherPrompt:
    """A message of another prompt of ours: kept for the job taken ahead's attempt when it is that job's
    (``started``: its execution_start)."""

    started: bool


@dataclass(frozen=True, slots=True)
class PollIn:
    """Read /history within ``seconds`` (sooner than planned, never later)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class ReadHistory:
    """Read /history now (then feed :class:`Polled` or :class:`Unreachable`)."""


@dataclass(frozen=True, slots=True)
class EntryFromSocket:
    """The run was watched whole: make its history entry of its messages."""


@dataclass(frozen=True, slots=True)
class ReadBuffered:
    """Read what the socket already holds, without waiting (its last messages; the job ahead's start)."""


@dataclass(frozen=True, slots=True)
class RenewLeases:
    """Renew the attempt's lease and those of the jobs taken ahead (then feed :class:`LeaseAnswer`)."""


@dataclass(frozen=True, slots=True)
class OfferAheadToPeer:
    """A job taken ahead waits behind this running prompt: it goes back if another runner waits for work."""


@dataclass(frozen=True, slots=True)
class WithdrawAhead:
    """A stop began: the job taken ahead, which cannot have started, is taken out of the server's queue."""


@dataclass(frozen=True, slots=True)
class Fail:
    """The run failed: the attempt ends through its retry policy (``transient``: retried)."""

    kind: str
    reason: str
    transient: bool = True


@dataclass(frozen=True, slots=True)
class Stop:
    """The attempt ends now with this outcome, not through the retry policy (a cancel, a stop)."""

    ending: Ending
    reason: str
    kind: str


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Interrupt the prompt and wait until it has left the server's queue, then end with ``then`` (a timeout
    whose prompt will not leave ends as that stuck prompt's failure instead)."""

    then: Fail | Stop


Action = (TraceIt | KeepPreview | OtherPrompt | PollIn | ReadHistory | EntryFromSocket | ReadBuffered | RenewLeases
          | OfferAheadToPeer | WithdrawAhead | Fail | Stop | Interrupt)

NOTHING: tuple[Action, ...] = ()
TRACE: tuple[Action, ...] = (TraceIt(),)
POLL_NOW = PollIn(0.0)
_TRACE_POLL_SOON: tuple[Action, ...] = (TraceIt(), PollIn(HISTORY_AFTER_SUCCESS_SECONDS))
_TRACE_POLL_NOW: tuple[Action, ...] = (TraceIt(), POLL_NOW)
_PREVIEW: tuple[Action, ...] = (KeepPreview(),)
_OTHER: tuple[Action, ...] = (OtherPrompt(False),)
_OTHER_STARTED: tuple[Action, ...] = (OtherPrompt(True),)
_POLL_NOW: tuple[Action, ...] = (POLL_NOW,)
_READ_HISTORY: tuple[Action, ...] = (ReadHistory(),)
_FROM_SOCKET: tuple[Action, ...] = (EntryFromSocket(),)
_FOUND: tuple[Action, ...] = (ReadBuffered(),)
_RENEW = RenewLeases()
_OFFER = OfferAheadToPeer()
_WITHDRAW = WithdrawAhead()
_OFFER_ONLY: tuple[Action, ...] = (_OFFER,)
CANCELLED = Stop(Ending.CANCELLED, "cancelled by user", "cancelled")
GRACEFUL_STOP = Stop(Ending.RELEASED, "interrupted by a graceful stop; attempt not counted", "shutdown")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the attempt gives its run's protocol when it begins to follow it."""

    job_id: str
    deadline: float
    """When the job's timeout falls (the clock of the events' ``now``)."""
    timeout_seconds: float
    poll_seconds: float
    server_lost_seconds: float


NO_LIMITS = Limits("", float("inf"), 0.0, 0.0, 0.0)
"""A run nobody follows (one interrupted by id): no message is its own."""


@dataclass(slots=True)
class RunMachine:
    """The protocol state of one attempt's run. Mutated only by its own methods; every event carries ``now``."""

    phase: Phase = Phase.QUEUED
    limits: Limits = NO_LIMITS
    watched_on: int = 0
    """The connection its execution_start was read on (0: none, or read by no socket of ours). While that
    connection still reads, no message of the run was lost: its ``executed`` outputs and its end, read there,
    are the whole of what /history would say."""
    queue_remaining: int | None = None
    """``exec_info.queue_remaining`` of the last ``status`` broadcast read."""
    interrupt_asked: bool = False
    """The attempt asked for its prompt's interrupt: an ``execution_interrupted`` is no failure then."""
    over: bool = False
    """Its history entry was read (or made of its messages): the run is over, its files are downloaded, and
    /history is not read again."""
    next_poll: float = 0.0
    """When /history is read next."""
    unreachable_since: float | None = None
    """Since when the server does not answer (None: it answered at the last read)."""
    outputs: dict[str, Any] = field(default_factory=dict)
    """The ``output`` of each ``executed`` message of this run, by node id (what its history entry lists)."""

    @property
    def started(self) -> bool:
        return self.phase is not _QUEUED

    @property
    def success_seen(self) -> bool:
        return self.phase is _SUCCEEDED or self.phase is _ENDED

    @property
    def end_seen(self) -> bool:
        return self.phase is _ENDED or self.phase is _LEFT

    def follow(self, limits: Limits, now: float, socket: bool) -> None:
        """The follow loop begins at ``now``: a run without a socket (caught up) may be over already, so its
        /history is read at once; a fresh one is announced on the socket."""
        self.limits = limits
        self.next_poll = now + (limits.poll_seconds if socket else 0.0)

    def wait(self, now: float, heartbeat_at: float) -> float:
        """How long the loop may wait for a message before its next wake-up."""
        return max(0.0, min(self.next_poll, self.limits.deadline, heartbeat_at) - now)

    def interrupting(self) -> None:
        """The attempt asks for its prompt's interrupt (an ``execution_interrupted`` is no failure from now)."""
        self.interrupt_asked = True

    def poll_within(self, now: float, seconds: float) -> None:
        """Read /history within ``seconds`` of ``now`` (never later than planned)."""
        self.next_poll = min(self.next_poll, now + seconds)

    def step(self, event: Event) -> tuple[Action, ...]:
        """Advance by one event; the actions, in the order the driver carries them out."""
        return _TABLE[type(event)](self, event)

    # -- the table ------------------------------------------------------------------------------------

    def _on_message(self, m: Message) -> tuple[Action, ...]:
        kind, data = m.kind, m.data
        if kind == "status":
            remaining = ((data.get("status") or {}).get("exec_info") or {}).get("queue_remaining")
            self.queue_remaining = remaining if isinstance(remaining, int) else None
            return NOTHING
        prompt_id = data.get("prompt_id")
        if kind == "preview":  # of the prompt executing now: this run's between its start and its end
            running = self.phase is _EXECUTING or self.phase is _SUCCEEDED
            return _PREVIEW if running and prompt_id in (None, self.limits.job_id) else NOTHING
        if prompt_id != self.limits.job_id:
            if prompt_id is None:  # a reconnection's bare ``executing``, a broadcast: nobody's
                return NOTHING
            return _OTHER_STARTED if kind == "execution_start" else _OTHER
        if kind == "execution_start":
            self.phase = _EXECUTING
            self.watched_on = m.connection
            self.outputs.clear()
            return TRACE
        if self.phase is _QUEUED:
            return NOTHING
        return self._own(kind, data)

    def _own(self, kind: str | None, data: dict[str, Any]) -> tuple[Action, ...]:
        """A message of this run after its start."""
        if kind == "executed" and self.watched_on and data.get("output") is not None:
            self.outputs[str(data.get("node"))] = data["output"]
        elif kind == "execution_success":
            self.phase = _SUCCEEDED
            return _TRACE_POLL_SOON
        elif kind == "executing" and data.get("node") is None:
            self.phase = _ENDED if self.phase is _SUCCEEDED else _LEFT
            return _TRACE_POLL_NOW
        elif kind == "execution_error":
            failure = execution_failure(data)
            return (TraceIt(), Fail(failure.kind, failure.reason, failure.transient))
        elif kind == "execution_interrupted" and not self.interrupt_asked:
            return (TraceIt(), Fail("interrupted", f"execution_interrupted at node {data.get('node_id')} "
                                    f"({data.get('node_type')}), not asked for by comfysup"))
        return TRACE

    def _on_reconnected(self, _: Reconnected) -> tuple[Action, ...]:
        return _POLL_NOW

    def _on_woke(self, w: Woke) -> tuple[Action, ...]:
        """The checkpoints of a wake-up, in order: the lease, the deadline, the job taken ahead, the stop; then
        /history when due (or the entry made of the socket's messages, for a run watched whole). The common
        wake-up allocates nothing."""
        if w.heartbeat_due or w.stop_at is not None or w.now >= self.limits.deadline:
            return self._checkpoints(w)
        due = NOTHING if self.over or w.now < self.next_poll else self._due(w)  # nothing due: the common wake-up
        if w.ahead_unstarted and w.peer_waiting and self._running():
            # A job taken ahead waits behind this one, which still runs: it cannot have started; it may go to
            # another runner that waits for work.
            return (_OFFER, *due) if due else _OFFER_ONLY
        return due

    def _running(self) -> bool:
        return not self.over and (self.phase is _QUEUED or self.phase is _EXECUTING)

    def _checkpoints(self, w: Woke) -> tuple[Action, ...]:
        """A wake-up with a heartbeat due, a stop begun or the deadline passed."""
        acts: list[Action] = [_RENEW] if w.heartbeat_due else []
        if w.now >= self.limits.deadline:
            acts.append(Interrupt(Fail("timeout", f"timed out after {self.limits.timeout_seconds:g} s")))
            return tuple(acts)
        if w.ahead_unstarted and self._running():
            # Queued behind this one, which still runs: it cannot have started. Once this one has ended it may
            # run (its start unread): its own attempt follows it through the grace instead.
            if w.peer_waiting:
                acts.append(_OFFER)
            if w.stop_at is not None:
                acts.append(_WITHDRAW)
        if w.stop_at is not None and w.now >= w.stop_at:
            acts.append(Interrupt(GRACEFUL_STOP))
            return tuple(acts)
        return (*acts, *self._due(w))

    def _due(self, w: Woke) -> tuple[Action, ...]:
        """/history to read now, or the entry to make of the messages of a run watched whole."""
        if self.over or w.now < self.next_poll:
            return NOTHING
        if self.phase is _ENDED and self.watched_on and w.connection == self.watched_on and w.every_output:
            return _FROM_SOCKET
        return _READ_HISTORY

    def _on_polled(self, p: Polled) -> tuple[Action, ...]:
        self.unreachable_since = None
        if p.found:  # over once its socket's last messages are read too (then :class:`Over`)
            return _FOUND
        self.next_poll = p.now + (HISTORY_AFTER_SUCCESS_SECONDS if self.success_seen else self.limits.poll_seconds)
        return NOTHING

    def _on_unreachable(self, u: Unreachable) -> tuple[Action, ...]:
        if self.unreachable_since is None:
            self.unreachable_since = u.now
        if u.now - self.unreachable_since >= self.limits.server_lost_seconds:
            return (Fail("server_died", f"the ComfyUI server died or stopped answering ({u.reason})"),)
        self.next_poll = u.now + (HISTORY_AFTER_SUCCESS_SECONDS if self.success_seen else self.limits.poll_seconds)
        return NOTHING

    def _on_lease(self, a: LeaseAnswer) -> tuple[Action, ...]:
        return (Interrupt(CANCELLED),) if a.cancelled else NOTHING

    def _on_over(self, _: Over) -> tuple[Action, ...]:
        self.over = True
        return NOTHING


_TABLE: dict[type, Callable[[RunMachine, Any], tuple[Action, ...]]] = {
    Message: RunMachine._on_message, Reconnected: RunMachine._on_reconnected, Woke: RunMachine._on_woke,
    Polled: RunMachine._on_polled, Unreachable: RunMachine._on_unreachable, LeaseAnswer: RunMachine._on_lease,
    Over: RunMachine._on_over}

