"""One attempt at one job (docs/design.md "One attempt, step by step"), ending in exactly one recorded outcome.

1. Catch up: a prompt of an earlier attempt that finished is adopted from /history; one still queued is
   followed where it is. Nothing is posted twice while a run of it may still exist.
2. POST /prompt with prompt_id = job id on the runner's kept WebSocket (one client id per runner, emptied
   of earlier messages; a job posted again gets a fresh client id, so none of its earlier run's messages
   can pass for this run's); record the returned number, which tells this run's history entry from
   others of the same id.
3. Follow events after this run's execution_start; reconnect a dropped socket with the same client id;
   read /history every poll_seconds and after each reconnection (success is announced before the history
   is written, and nothing is replayed to a reconnected socket). A run whose every message from its
   execution_start to its end (``executing`` with node None, sent after ComfyUI wrote the history) was
   read on one connection needs no /history: its ``execution_success`` and ``executed`` outputs are what
   the entry holds, checked the same way. Renew the lease from this loop.
4. On the deadline (or a cancel, or the end of a graceful stop's grace) interrupt the prompt, delete it
   from the queue and wait until it has left /queue before the attempt ends.
5. Download outputs to temporary names, then rename. 6. Record done, fenced (with the next claim, in one
   transaction, when the runner goes on: see comfysup.runner.record).

Every write to the queue is fenced; a LeaseLost anywhere ends the attempt without writing anything. A queue
that does not answer (QueueUnavailable) is ridden out while the lease holds by this machine's clock: the prompt
is followed on, and renewals and the writes the attempt cannot go on without are tried again
(comfysup.runner.hold). Once the lease's end is near, or on any other QueueError, the attempt ends as for a lost
lease, after interrupting the prompt: the job must not still run here when the lease hands it to another runner,
perhaps on another machine that cannot see this server.

The shape: a :class:`Station` (comfysup.runner.station) holds what a runner keeps from one attempt to the
next (settings, queue, result store, the server's client and its kept WebSocket, peers' clients, the
runner's hooks and clocks); the values an attempt returns are in comfysup.runner.result.
An :class:`Attempt` lives for one attempt: ``Attempt(station, claim, ...).run()`` returns an
:class:`AttemptResult`: the outcome it recorded and, when the runner goes on, the jobs it took ahead (claimed,
and maybe already posted), which the runner hands to the next ``Attempt`` as values. Its steps are the phases of
a pure machine (comfysup.runner.steps.AttemptMachine): the attempt is its driver, carrying out the one step the
machine asks for and feeding back what that step found. What the follow loop reads is fed to the run's own pure
protocol machine (comfysup.runner.machine) by its driver (comfysup.runner.driver).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from comfysup.comfy import ComfyError, MalformedAnswer, PermanentError, deadline
from comfysup.comfy.history import unlisted_savers
from comfysup.errors import LeaseLost, QueueError, QueueUnavailable
from comfysup.queue.base import Claim, Output, Queue
from comfysup.runner import download, memory
from comfysup.runner import outputs as job_outputs
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.catchup import catch_up
from comfysup.runner.driver import FollowDriver
from comfysup.runner.hold import Keeper, LeaseHold, reserve_seconds
from comfysup.runner.interrupt import Interrupter
from comfysup.runner.machine import Limits, Over
from comfysup.runner.post import post_prompt
from comfysup.runner.record import Progress, record
from comfysup.runner.result import Ahead, AheadAsks, AttemptResult, Ending, Outcome
from comfysup.runner.retry import decide
from comfysup.runner.running import Context, Heartbeat, Run, ShieldedQueue, Stop, redactor_of
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.steps import (
    CATCH_UP,
    POSTED,
    STEPS,
    Action,
    Alarm,
    AttemptMachine,
    AttemptPhase,
    Broke,
    CatchUp,
    CaughtUp,
    Download,
    Downloaded,
    Event,
    Failed,
    Follow,
    Found,
    Free,
    Freed,
    Interrupt,
    Interrupted,
    LeaseGone,
    Post,
    Posted,
    QueueGone,
    Record,
    Recorded,
    RecordFailure,
    Stopped,
    Succeeded,
    Terms,
)
from comfysup.runner.trace import Trace

__all__ = ["Attempt", "AttemptResult", "AttemptSettings", "Ending", "Outcome", "Station"]
"""Outcome and the rest are also importable from here, where the supervisor and tests find them."""

log = logging.getLogger("comfysup.runner")
ALARM_SLACK_SECONDS = 1.0
"""The job's deadline is checked at every wake-up of the follow loop, which interrupts the prompt then; the
alarm (comfysup.comfy.deadline) falls this much later, for what no wake-up reaches: a read that blocks, a
download that trickles."""
OVER = Over()


class Attempt:
    """One attempt at one job, from its claim to its recorded outcome; made for that attempt and dropped.

    The server idles from the end of one prompt to the start of the next, so the next job is taken ahead as
    early as it safely can be (comfysup.runner.ahead), when ``asks`` allows:
    - queued ahead (``asks.queue_ahead``, [runner] queue_ahead): once this prompt executes, one more job is
      claimed and posted behind it, so ComfyUI starts it the moment this one ends, whatever this runner is
      doing then. At most one: it is asked once, and only while the server holds no other waiting prompt of
      ours. Its lease is renewed here; a cancel of it, or a graceful stop before it started, takes it out of
      the server's queue (and records the cancel, or releases it uncounted). Once this prompt has ended and
      the queued one runs, one more is claimed with this one's done (one transaction) and posted behind that
      one as soon as it committed, while that one executes, and handed to the next attempt with it;
    - the hand-off (``asks.hand_off``): when the prompt succeeded and the server's broadcast said its queue is
      empty, the next job is claimed and posted at once, and this job's outputs are downloaded and recorded
      while the server runs it;
    - otherwise a done is recorded together with the next claim, in one transaction.

    ``taken``: the jobs the attempt before took ahead, this claim's first (``taken[0]``, where this attempt
    starts when it was posted), then the one queued behind it (this attempt's next job from the start).
    """

    def __init__(self, station: Station, claim: Claim, asks: AheadAsks | None = None,
                 taken: tuple[Ahead, ...] = ()) -> None:
        self.station = station
        self.s = station.settings
        self.queue: Queue = ShieldedQueue(station.queue)  # type: ignore[assignment]
        self.client = station.client
        self.clock = station.clock
        self.claim = claim
        own = taken[0] if taken and taken[0].claim.id == claim.id else None
        self.taken = own if own is not None and own.posted else None
        """This job's prompt, posted by the attempt before (queued ahead, or at its hand-off)."""
        self.replay = list(self.taken.events) if self.taken is not None else []
        """Messages of this job's prompt read by the attempt that queued it: handled before the socket's."""
        self.waiting = claim.waiting or (self.taken is not None and self.taken.waiting)
        """The queue shows the job as posted (waiting for its server) until this attempt says it executes."""
        self.redact = redactor_of(claim)
        self.deadline = self.clock() + self.s.timeout_seconds
        self.limits = Limits(claim.id, self.deadline, self.s.timeout_seconds, self.s.poll_seconds,
                             self.s.server_lost_seconds)
        self.heartbeat = Heartbeat(self.s.heartbeat_seconds, self.clock() + self.s.heartbeat_seconds)
        self.trace = Trace.start(claim.workflow, self.taken.claimed_at if self.taken else station.wall())
        self.ctx = Context(station, self.s, claim, self.queue, self.client, self.clock, station.wall, self.trace)
        """What each step reads (comfysup.runner.running.Context)."""
        self.ahead = AheadJobs(self.ctx, asks or AheadAsks(), taken[1] if len(taken) > 1 else None,
                               interrupt=self._interrupt, own_renewed_at=own.renewed_at if own is not None else None)
        """The jobs this attempt takes ahead (comfysup.runner.ahead)."""
        hold = LeaseHold(self.s.lease_seconds, reserve_seconds(self.s.heartbeat_seconds, self.s.queue_wait_seconds),
                         own.renewed_at if own is not None else self.clock() - self.s.heartbeat_seconds)
        self.keeper = Keeper(hold, self.clock, self.heartbeat.now, self.ahead.oldest_renewal, claim.id,
                             station.on_alive)
        """The attempt's hold on its leases while the queue does not answer (comfysup.runner.hold)."""
        self.interrupter = Interrupter(self.ctx, self.heartbeat, self.keeper, self.ahead.renew,
                                       self.ahead.withdraw_next)
        self.progress = Progress(self.ctx, self.keeper)
        self.driver = FollowDriver(self.ctx, self.ahead, self.heartbeat, self.progress, self.limits, self.replay,
                                   self._interrupt_to_end, self._started, self.keeper)
        """What follows a run: the driver of its machine (comfysup.runner.driver)."""
        self.live: Run | None = None
        """The prompt of this job known to be on a server (posted or followed), to stop if the queue goes."""
        self.current: Run | None = None
        """The run the steps work on: the one catch-up found (followed or adopted), or the one posted."""
        self.machine = AttemptMachine(Terms(claim.attempt, self.s.policy.attempts, claim.last_reason,
                                            claim.cancel_requested, self.s.timeout_seconds))
        """The attempt's steps (comfysup.runner.steps): this object carries out the actions it returns."""
        self.timeout_due: deadline.Due | None = None
        """The alarm of the job's timeout, while the steps run under it."""

    def run(self) -> AttemptResult:
        """Run the attempt (once) and record its outcome; LeaseLost at any point means: stop, write nothing."""
        m = self.machine
        try:
            self._carry(self._through_steps(), _RECORDING)
        except LeaseLost as exc:
            self._carry(m.step(LeaseGone(str(exc))), _RECORDING)
        except QueueError as exc:
            if self.live is not None and self.live.stream is not None:
                self.live.stream.close()  # idempotent; the steps did not close it when record_prompt failed
            self._carry(m.step(QueueGone(str(exc))), _INTERRUPTING)
        assert m.outcome is not None
        with contextlib.suppress(QueueError):  # a queue that does not answer: left unrecorded, as after a kill
            self.ahead.record_unrecorded()
        result = AttemptResult(m.outcome, tuple(self.ahead.jobs))
        self._let_go()
        return result

    def _let_go(self) -> None:
        """The attempt is over: the parts that call back into it (its driver, its jobs taken ahead, its
        interrupter) are dropped, so that it and all it read (messages, trace, run) are freed by their reference
        counts the moment the runner drops it, not left as cycles for the garbage collector to walk."""
        del self.driver, self.ahead, self.interrupter

    def _through_steps(self) -> Action:
        """The steps, and the interrupt that ends them early, up to the outcome to record. An internal error, or
        an alarm that fell outside the steps (their own ends them), ends them too; a lost lease or queue ends the
        attempt unrecorded (raised)."""
        try:
            return self._carry(self._under_alarm(), _INTERRUPTING)
        except (LeaseLost, QueueError):
            raise
        except deadline.DeadlineExceeded as exc:
            return self._carry(self.machine.step(Alarm(exc.kind, exc.what, None)), _INTERRUPTING)
        except Exception as exc:  # a bug of ours: this attempt fails, the runner lives on
            log.exception("job %s attempt %d: internal error", self.claim.id, self.claim.attempt)
            broke = Broke(f"comfysup internal error: {type(exc).__name__}: {exc}")
            return self._carry(self.machine.step(broke), _INTERRUPTING)

    def _under_alarm(self) -> Action:
        """The steps under the job's deadline: a read that blocks or trickles past the job's timeout (or a stop's
        grace) is interrupted by the alarm, and the prompt is interrupted after it. Returns the action that
        follows the steps."""
        try:
            with deadline.until(self.deadline + ALARM_SLACK_SECONDS,
                                f"the job's timeout of {self.s.timeout_seconds:g} s", kind="attempt") as due:
                self.timeout_due = due
                return self._steps()
        except deadline.DeadlineExceeded as exc:
            during = self.trace.phases[-1][0] if self.trace.phases else "starting"
            return self.machine.step(Alarm(exc.kind, exc.what, during))

    def _steps(self) -> Action:
        try:
            return self._carry(CATCH_UP, STEPS)
        finally:
            if self.live is not None and self.live.stream is not None and self.live.stream is not self.client.stream:
                self.live.stream.close()  # a followed run's own socket; the client's kept one stays open

    def _carry(self, action: Action, phases: frozenset[AttemptPhase]) -> Action:
        """Carry out the machine's actions while it is in one of ``phases``, feeding it what each found; the
        action it asked for on leaving them."""
        m = self.machine
        while m.phase in phases:
            action = m.step(self._do(action))
        return action

    def _do(self, action: Action) -> Event:
        """One action; what it found. A step's failure (ComfyError) or early end (Stop) is what it found too."""
        if self.machine.phase not in STEPS:
            return _ACTIONS[type(action)](self, action)
        try:
            return _ACTIONS[type(action)](self, action)
        except Stop as stop:
            return Stopped(stop.outcome.state, stop.outcome.reason, stop.outcome.kind)
        except ComfyError as exc:
            memory.device_lost(exc.kind, exc.reason, self.s.server, self.station.memory)
            run = self.current
            return Failed(exc.kind, exc.reason, not isinstance(exc, PermanentError),
                          run is not None and run.client is self.client, self.ahead.next_posted is not None)

    # -- the steps, each as the machine asks for it ------------------------------------------------------

    def _catch_up(self, act: CatchUp) -> CaughtUp:
        """Step 1: the run of this job an earlier attempt left, to follow or adopt (comfysup.runner.catchup)."""
        # Where earlier attempts ran is read from the queue: waited for within the lease. A prompt already posted
        # (taken ahead) is the one to stop meanwhile if the lease runs out first: never left running unowned.
        taken = self.taken
        if taken is not None and taken.number is not None:
            self.live = Run(self.client, self.s.server, taken.number)
        run, followed = self.keeper.persist(partial(catch_up, self.ctx, taken))
        self.live = None
        self.current = run
        if run is None:
            return _NOTHING
        if not followed:
            return _ADOPTED
        # Still in a server's queue: where, and its number, recorded before anything else.
        assert run.number is not None
        self.live = run
        self.keeper.persist(partial(self.queue.leases.record_prompt, self.claim, run.server, run.number,
                                    run.client.url, waiting=not run.m.started))
        self.waiting = not run.m.started  # still pending in that server's queue: shown posted until it runs
        return _FOLLOW

    def _post_step(self, act: Post) -> Posted:
        if act.again:  # after an out-of-memory error and POST /free: the failed run is dropped
            failed = self.current
            if failed is not None and failed.stream is not None and failed.stream is not failed.client.stream:
                failed.stream.close()
            log.info("job %s attempt %d on %s: out of memory; POST /free, then posted again on this server "
                     "(not counted as an attempt)", self.claim.id, self.claim.attempt, self.s.server,
                     extra={"event": "oom_retry"})
        self.current = self._post(again=act.again)
        return POSTED

    def _follow(self, act: Follow) -> Succeeded:
        """Step 3 (comfysup.runner.driver): until the run's history entry says success."""
        assert self.current is not None
        return Succeeded(self.driver.follow(self.current))

    def _free(self, act: Free) -> Freed:
        """POST /free after an out-of-memory error (comfysup.runner.memory)."""
        if not memory.free(self.client.free, self.s.server, self.station.memory):
            return _NOT_FREED
        self.station.memory.count("oom_retries")
        return _FREED

    def _over(self, act: Download) -> Downloaded:
        """Step 5 of a run that succeeded: the jobs taken ahead first, then its files."""
        run, entry = self.current, act.entry
        assert run is not None
        if self.waiting:  # over (adopted, or its start was not read): no longer waiting for its server
            self._executes()
        run.m.step(OVER)
        if self.ahead.may_hand_off(run):
            self.ahead.hand_off()
        if run.from_disk is None and (unlisted := unlisted_savers(entry, self.claim.workflow)):
            raise MalformedAnswer(f"server sent a history entry of a successful run that lists no file of "
                                  f"{', '.join(unlisted[:5])}")
        outputs = self._download(run, entry)
        return Downloaded(outputs, run.adopted_entry is not None, run.from_disk is not None,
                          run.m.end_seen and run.m.queue_remaining == 0 and run.client is self.client)

    def _interrupt_step(self, act: Interrupt) -> Interrupted:
        """Step 4 for an attempt that ends early: its prompt interrupted and waited out."""
        return Interrupted(self._interrupt(self.current if act.caught_up else self.live, renew=act.renew))

    def _record_failure(self, act: RecordFailure) -> Recorded:
        """Step 6 of a failure: retried or dead, as the retry policy decides (comfysup.runner.retry)."""
        failure = act.failure
        decision = decide(self.s.policy, self.claim.attempt, failure)
        if decision.dead:
            return self._record(Outcome(Ending.DEAD, decision.reason, kind=failure.kind))
        return self._record(Outcome(Ending.RETRY, decision.reason, kind=failure.kind,
                                    delay_seconds=decision.delay_seconds))

    def _record_step(self, act: Record) -> Recorded:
        return self._record(act.outcome)

    def _record(self, outcome: Outcome) -> Recorded:
        """Step 6 (comfysup.runner.record): the outcome, redacted, in one fenced write; a done claims the job to
        queue behind the next one in it, posted once it committed (comfysup.runner.ahead)."""
        outcome.reason = self.redact(outcome.reason)
        run = self.current
        if outcome.state is Ending.DONE and run is not None and self.ahead.may_queue_behind_next(run):
            self.ahead.ask_behind_next(run, partial(self.driver.drain, run))
        self.keeper.persist(partial(record, self.ctx, outcome, self.ahead, self.redact))
        self.ahead.post_behind_next()
        if outcome.state is Ending.DONE:  # a dead job's run stays: a person's retry adopts it from /history
            download.remove_job_folders(self.ctx)
        with contextlib.suppress(QueueError):  # best-effort: the next post evicts again
            self.station.inputs.trim()  # its inputs may go now
        return Recorded(outcome)

    # -- 2. post ----------------------------------------------------------------------------------------

    def _post(self, again: bool = False) -> Run:
        """POST the job (``again``: once more in this attempt, after an out-of-memory error: a fresh client id,
        and the failed run's files out of the job's folder)."""
        if self.taken is not None:  # posted by the previous attempt, queued ahead or at its hand-off
            taken, self.taken = self.taken, None
            if taken.error is not None:
                raise taken.error
            self.trace.phase("posted", taken.posted_at)
            self.live = Run(self.client, self.s.server, taken.number, stream=self.client.own_stream(drain=False),
                            started=taken.started, behind_lost=taken.behind_lost)
            return self.live
        # The kept socket, emptied of what earlier prompts left in it; a job posted again gets a new client
        # id, so no message of its earlier run can be read as one of this run.
        stream = self.client.own_stream(fresh=again or self.claim.attempt > 1)
        if self.s.server in self.s.output_dirs and (again or self.claim.attempt > 1
                                                     or self.claim.last_server is not None):
            # Leftovers of an earlier run must not mix with this run's files in a later adoption.
            job_outputs.discard(self.s.output_dirs, self.s.server, self.claim.id)
        number = post_prompt(self.ctx, self.claim, stream.client_id)
        log.info("job %s attempt %d on %s: POST /prompt 200", self.claim.id, self.claim.attempt, self.s.server,
                 extra={"event": "posted"})
        self.trace.phase("posted", self.ctx.wall())
        self.live = Run(self.client, self.s.server, number, stream=stream)
        # On a free server: it executes. Its number is recorded before it is followed, the queue answering or not.
        self.keeper.persist(partial(self.queue.leases.record_prompt, self.claim, self.s.server, number, self.s.url))
        self.waiting = False
        return self.live

    def _started(self) -> None:
        """The run's execution_start was read: the queue no longer shows the job as posted (once)."""
        if self.waiting:
            self._executes()

    def _executes(self) -> None:
        """The job's execution started (or its run is over) and the queue still shows it as posted: one fenced
        write, only when the attempt ahead of it did not record the start with its own end."""
        self.waiting = False
        if not self.keeper.failing:  # else shown posted a while longer: renewals come first
            with contextlib.suppress(QueueUnavailable):
                self.queue.leases.set_waiting(self.claim, False)

    def _interrupt_to_end(self, run: Run) -> str | None:
        """Interrupt the run because the attempt ends here (its timeout, a cancel, a stop), seen at a wake-up: the
        job's alarm is settled first. It must not fall once the interrupt is over (a stuck prompt's restart can
        outlast ALARM_SLACK_SECONDS) and turn that end into a timeout, interrupting the job a second time."""
        if self.timeout_due is not None:
            deadline.settle(self.timeout_due)
        return self._interrupt(run)

    def _interrupt(self, run: Run | None, renew: bool = True, prompt_id: str | None = None) -> str | None:
        """Step 4 (comfysup.runner.interrupt): interrupt ``run``'s prompt and wait until it has left its queue."""
        return self.interrupter.interrupt(run, renew, prompt_id)

    def _download(self, run: Run, entry: dict[str, Any]) -> list[Output]:
        """Step 5 (comfysup.runner.download): the run's files into the store, the attempt's checks between them."""

        def checkpoint(renew_now: bool) -> None:
            if renew_now and not self.ahead.renewed_own(self.clock()):
                self.heartbeat.now(self.clock())
            self.driver.wake(run, self.clock())

        return download.download(self.ctx, run, entry, checkpoint)


_ACTIONS: dict[type, Callable[[Attempt, Any], Event]] = {
    CatchUp: Attempt._catch_up, Post: Attempt._post_step, Follow: Attempt._follow, Free: Attempt._free,
    Download: Attempt._over, Interrupt: Attempt._interrupt_step, Record: Attempt._record_step,
    RecordFailure: Attempt._record_failure,
}
"""What the attempt does for each action of its machine."""
_INTERRUPTING = frozenset({AttemptPhase.INTERRUPTING})
_RECORDING = frozenset({AttemptPhase.RECORDING})
_NOTHING = CaughtUp(Found.NOTHING)
_ADOPTED = CaughtUp(Found.ADOPTED)
_FOLLOW = CaughtUp(Found.FOLLOW)
_FREED = Freed(True)
_NOT_FREED = Freed(False)
