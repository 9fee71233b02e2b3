"""The steps of one attempt (docs/design.md "One attempt, step by step"), as a small pure state machine (the
supervisor's Policy and the run's RunMachine are its models).

The attempt (comfysup.runner.attempt) is its driver: it carries out the one action :meth:`AttemptMachine.step`
returns (a step: catch up, post, follow, POST /free, download, interrupt, record), and feeds back the event
that step produced, until the machine has ENDED with the attempt's :class:`Outcome`. Nothing here does I/O or
reads a clock, so every path of an attempt is tested by setting a phase and stepping events
(tests/unit/test_attempt_machine.py).

What the steps promise:
- a run an earlier attempt left is followed or adopted, never posted again; a job is posted only when catch-up
  found none, and not at all once its attempts are spent;
- a cancel asked before the post interrupts what catch-up found and ends cancelled;
- a run that fails goes through the retry policy (the driver's ``decide``), except an out-of-memory error on this
  runner's own server, once a counted attempt: POST /free, then the job is posted once more in this attempt, or
  given back uncounted while a job of ours waits behind it (comfysup.runner.memory.after_oom);
- the job's alarm (its timeout, or the end of a stop's grace), met inside a blocking step, and an internal error
  interrupt the prompt and wait it out before the outcome is recorded; a stuck prompt is a timeout's failure;
- a lost lease ends the attempt at once with nothing written; a queue that does not answer until the lease's end
  is near (comfysup.runner.hold) ends it the same way, after its prompt was interrupted (it must not run on once
  the lease could hand the job to another runner).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from comfysup.queue.base import Output
from comfysup.runner import memory
from comfysup.runner.result import Ending, Outcome
from comfysup.runner.retry import Failure, gave_up
from comfysup.runner.stuck import STUCK_KIND


class AttemptPhase(enum.StrEnum):
    """Where an attempt is."""

    CATCHING_UP = "catching_up"  # looking for a run of the job an earlier attempt left on a server (step 1)
    POSTING = "posting"  # posting the job, or taking over its post by the attempt before (step 2)
    FOLLOWING = "following"  # following its run to its end; an adopted run's entry is at hand (step 3)
    FREEING = "freeing"  # its run ran out of memory: POST /free, before it is posted again or given back
    DOWNLOADING = "downloading"  # its run succeeded: the jobs taken ahead first, then its files (step 5)
    INTERRUPTING = "interrupting"  # it ends early: its prompt interrupted and waited out of the queue (step 4)
    RECORDING = "recording"  # its outcome written, fenced (step 6)
    ENDED = "ended"  # over: its outcome recorded, or nothing written (its lease or its queue gone)


STEPS = frozenset({AttemptPhase.CATCHING_UP, AttemptPhase.POSTING, AttemptPhase.FOLLOWING, AttemptPhase.FREEING,
                   AttemptPhase.DOWNLOADING})
"""The phases that run under the job's alarm (the interrupt and the record come after it)."""


class Found(enum.Enum):
    """What catch-up found of an earlier attempt's run."""

    FOLLOW = "follow"  # a prompt of the job still in a server's queue: followed where it is
    ADOPTED = "adopted"  # a finished run, from a server's /history or its output folder
    NOTHING = "nothing"  # no run: the job is posted


@dataclass(frozen=True, slots=True)
class Terms:
    """What the attempt's claim and settings say, given to its machine at the start."""

    attempt: int
    attempts: int
    """How many attempts the retry policy allows."""
    last_reason: str | None
    cancel_asked: bool
    timeout_seconds: float


# -- events: what a step found (immutable values) ---------------------------------------------------------------

class CaughtUp(NamedTuple):
    found: Found


class Posted(NamedTuple):
    """The job's prompt is on the server (posted now, or by the attempt before)."""


class Succeeded(NamedTuple):
    """The run succeeded: its history entry (or one made of its messages, or the adopted one)."""

    entry: dict[str, Any]


class Failed(NamedTuple):
    """A step failed (a ComfyError): ``own_server``, ``behind``: its run was on this runner's server, a job of
    ours waits posted behind it (what an out-of-memory error decides by)."""

    kind: str
    reason: str
    transient: bool = True
    own_server: bool = False
    behind: bool = False


class Stopped(NamedTuple):
    """A step ended the attempt with this outcome, not through the retry policy (a cancel, a stop, a release)."""

    ending: Ending
    reason: str
    kind: str


class Freed(NamedTuple):
    """POST /free was answered (``ok``), or not."""

    ok: bool


class Downloaded(NamedTuple):
    outputs: list[Output]
    adopted: bool
    adopted_from_disk: bool
    server_free: bool


class Alarm(NamedTuple):
    """The job's alarm fell (``kind`` "stop": a stop's grace ended), while the trace's phase ``during``; None: it
    fell outside the steps."""

    kind: str
    what: str
    during: str | None


class Broke(NamedTuple):
    """A step raised what nothing expects: a bug of ours (the attempt fails, the runner lives on)."""

    reason: str


class Interrupted(NamedTuple):
    """The prompt was interrupted and left its queue; ``stuck``: why it did not leave."""

    stuck: str | None


class Recorded(NamedTuple):
    """The outcome was written (its reason redacted)."""

    outcome: Outcome


class LeaseGone(NamedTuple):
    """The lease was lost: a write was refused by its fence."""

    reason: str


class QueueGone(NamedTuple):
    """The queue did not answer."""

    reason: str


Event = (CaughtUp | Posted | Succeeded | Failed | Stopped | Freed | Downloaded | Alarm | Broke | Interrupted
         | Recorded | LeaseGone | QueueGone)


# -- actions: the step the driver carries out next ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CatchUp:
    """Step 1: look for a run an earlier attempt left (then :class:`CaughtUp`)."""


@dataclass(frozen=True, slots=True)
class Post:
    """Step 2: post the job (``again``: once more after an out-of-memory error, the failed run dropped)."""

    again: bool = False


@dataclass(frozen=True, slots=True)
class Follow:
    """Step 3: follow the run to its end (then :class:`Succeeded`)."""


@dataclass(frozen=True, slots=True)
class Free:
    """POST /free after an out-of-memory error (then :class:`Freed`)."""


@dataclass(frozen=True, slots=True)
class Download:
    """Step 5: the jobs taken ahead, then the run's files (then :class:`Downloaded`)."""

    entry: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Step 4: interrupt the prompt the attempt posted or follows (``caught_up``: whatever catch-up found, an
    adopted run too) and wait until it left its queue, renewing the leases unless the queue is gone."""

    renew: bool = True
    caught_up: bool = False


@dataclass(frozen=True, slots=True)
class Record:
    """Step 6: write this outcome (then :class:`Recorded`)."""

    outcome: Outcome


@dataclass(frozen=True, slots=True)
class RecordFailure:
    """Step 6 for a failure: the retry policy decides retry or dead, then it is written (then :class:`Recorded`)."""

    failure: Failure


@dataclass(frozen=True, slots=True)
class End:
    """Nothing more to do: the attempt's outcome (LOST: nothing was written)."""

    outcome: Outcome


Action = CatchUp | Post | Follow | Free | Download | Interrupt | Record | RecordFailure | End

CATCH_UP = CatchUp()
POST = Post()
POST_AGAIN = Post(again=True)
FOLLOW = Follow()
FREE = Free()
POSTED = Posted()


class AttemptMachine:
    """The steps of one attempt. Mutated only by :meth:`step`."""

    __slots__ = ("oom", "oom_retried", "outcome", "phase", "stuck_fails", "terms", "then")

    def __init__(self, terms: Terms) -> None:
        self.terms = terms
        self.phase = AttemptPhase.CATCHING_UP
        """Its first action is :data:`CATCH_UP`."""
        self.oom_retried = False
        """The job was posted once more (or given back) after an out-of-memory error in this attempt."""
        self.oom: tuple[str, Failed] | None = None
        """While FREEING: what the OOM leads to (memory.POST_AGAIN or memory.RELEASE) and the failure itself."""
        self.then: Outcome | Failure | None = None
        """While INTERRUPTING: what the attempt ends in once the prompt has left."""
        self.stuck_fails = False
        """While INTERRUPTING: a prompt that does not leave is the failure (a timeout's interrupt)."""
        self.outcome: Outcome | None = None
        """Once ENDED: the attempt's outcome."""

    def step(self, event: Event) -> Action:
        """Advance by what the last step found; the step to carry out next."""
        handler = _TABLE.get((self.phase, type(event)))
        if handler is None:
            raise ValueError(f"attempt in phase {self.phase}: unexpected {type(event).__name__}")
        return handler(self, event)

    # -- moves ----------------------------------------------------------------------------------------

    def _to(self, phase: AttemptPhase, action: Action) -> Action:
        self.phase = phase
        return action

    def _record(self, outcome: Outcome) -> Action:
        return self._to(AttemptPhase.RECORDING, Record(outcome))

    def _judge(self, failure: Failure) -> Action:
        return self._to(AttemptPhase.RECORDING, RecordFailure(failure))

    def _interrupt(self, then: Outcome | Failure, *, stuck_fails: bool = False, renew: bool = True,
                   caught_up: bool = False) -> Action:
        self.then = then
        self.stuck_fails = stuck_fails
        return self._to(AttemptPhase.INTERRUPTING, Interrupt(renew, caught_up))

    def _end(self, outcome: Outcome) -> Action:
        self.outcome = outcome
        return self._to(AttemptPhase.ENDED, End(outcome))

    # -- the table ------------------------------------------------------------------------------------

    def _caught_up(self, e: CaughtUp) -> Action:
        t = self.terms
        if t.cancel_asked:
            return self._interrupt(Outcome(Ending.CANCELLED, "cancelled by user", kind="cancelled"), caught_up=True)
        if e.found is not Found.NOTHING:
            return self._to(AttemptPhase.FOLLOWING, FOLLOW)
        if t.attempt > t.attempts:
            return self._record(Outcome(Ending.DEAD, gave_up(t.attempt - 1, t.last_reason), kind="gave_up"))
        return self._to(AttemptPhase.POSTING, POST)

    def _posted(self, e: Posted) -> Action:
        return self._to(AttemptPhase.FOLLOWING, FOLLOW)

    def _succeeded(self, e: Succeeded) -> Action:
        return self._to(AttemptPhase.DOWNLOADING, Download(e.entry))

    def _run_failed(self, e: Failed) -> Action:
        """The run failed: an out-of-memory error may be freed and posted again (or released) first."""
        retried = self.oom_retried or (self.terms.last_reason or "").startswith(memory.RELEASED_REASON)
        then = memory.after_oom(e.kind, retried, e.own_server, e.behind)
        if then is None:
            return self._failed(e)
        self.oom_retried = True
        self.oom = (then, e)
        return self._to(AttemptPhase.FREEING, FREE)

    def _freed(self, e: Freed) -> Action:
        assert self.oom is not None
        then, failed = self.oom
        self.oom = None
        if not e.ok:  # a server that cannot answer /free is no place for the job now
            return self._failed(failed)
        if then == memory.RELEASE:
            return self._record(Outcome(Ending.RELEASED, f"{memory.RELEASED_REASON} (last: {failed.reason})",
                                        kind="oom"))
        return self._to(AttemptPhase.POSTING, POST_AGAIN)

    def _failed(self, e: Failed) -> Action:
        return self._judge(Failure(e.kind, e.reason, e.transient))

    def _stopped(self, e: Stopped) -> Action:
        return self._record(Outcome(e.ending, e.reason, kind=e.kind))

    def _downloaded(self, e: Downloaded) -> Action:
        return self._record(Outcome(Ending.DONE, kind="done", outputs=e.outputs, adopted=e.adopted,
                                    adopted_from_disk=e.adopted_from_disk, server_free=e.server_free))

    def _alarm(self, e: Alarm) -> Action:
        if e.during is None:  # outside the steps: a stuck prompt is not looked at
            if e.kind == "stop":
                return self._interrupt(Outcome(Ending.RELEASED, f"interrupted by {e.what}; attempt not counted",
                                               kind="shutdown"))
            return self._interrupt(Failure("timeout", f"timed out ({e.what})", True))
        if e.kind == "stop":
            return self._interrupt(Outcome(Ending.RELEASED, f"interrupted by a stop ({e.what}) while {e.during}; "
                                           "attempt not counted", kind="shutdown"))
        return self._interrupt(Failure("timeout", f"timed out after {self.terms.timeout_seconds:g} s (while "
                                       f"{e.during}: the server did not answer in time)", True), stuck_fails=True)

    def _broke(self, e: Broke) -> Action:
        return self._interrupt(Failure("internal", e.reason, transient=True))

    def _interrupted(self, e: Interrupted) -> Action:
        then = self.then
        assert then is not None
        if isinstance(then, Failure):
            return self._judge(Failure(STUCK_KIND, e.stuck, True) if e.stuck and self.stuck_fails else then)
        if then.state is Ending.LOST:  # the queue is gone: nothing can be written
            return self._end(then)
        return self._record(then)

    def _recorded(self, e: Recorded) -> Action:
        return self._end(e.outcome)

    def _lease_gone(self, e: LeaseGone) -> Action:
        return self._end(Outcome(Ending.LOST, e.reason, kind="lease_lost"))

    def _queue_gone(self, e: QueueGone) -> Action:
        return self._interrupt(Outcome(Ending.LOST, f"the queue did not answer ({e.reason}); the prompt was "
                                       "interrupted and nothing was recorded: the job comes back when its lease "
                                       "expires", kind="queue_unavailable"), renew=False)


_P = AttemptPhase
_Handler = Callable[[AttemptMachine, Any], Action]
_TABLE: dict[tuple[AttemptPhase, type], _Handler] = {
    (_P.CATCHING_UP, CaughtUp): AttemptMachine._caught_up,
    (_P.POSTING, Posted): AttemptMachine._posted,
    (_P.FOLLOWING, Succeeded): AttemptMachine._succeeded,
    (_P.FOLLOWING, Failed): AttemptMachine._run_failed,
    (_P.FREEING, Freed): AttemptMachine._freed,
    (_P.DOWNLOADING, Downloaded): AttemptMachine._downloaded,
    (_P.INTERRUPTING, Interrupted): AttemptMachine._interrupted,
    (_P.RECORDING, Recorded): AttemptMachine._recorded,
}
"""What each phase does with what its own step found, and (below) with what may end it early."""
for _phase in (_P.CATCHING_UP, _P.POSTING, _P.FOLLOWING, _P.DOWNLOADING):
    _TABLE.setdefault((_phase, Failed), AttemptMachine._failed)  # FOLLOWING's own handles an OOM first
    _TABLE[(_phase, Stopped)] = AttemptMachine._stopped
for _phase in (*STEPS, _P.INTERRUPTING):
    _TABLE[(_phase, Alarm)] = AttemptMachine._alarm
    _TABLE[(_phase, Broke)] = AttemptMachine._broke
for _phase in (*STEPS, _P.INTERRUPTING, _P.RECORDING):
    _TABLE[(_phase, LeaseGone)] = AttemptMachine._lease_gone
    _TABLE[(_phase, QueueGone)] = AttemptMachine._queue_gone
