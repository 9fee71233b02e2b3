"""One attempt at one job, step by step (docs/design.md "One attempt"), ending in exactly one recorded outcome.

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

Every write to the queue is fenced; a LeaseLost anywhere ends the attempt without writing anything. A
queue that does not answer (QueueError) ends it the same way, after interrupting the prompt: the attempt
can no longer renew its lease, and the job must not still run here when the lease hands it to another
runner, perhaps on another machine that cannot see this server.

The shape: a :class:`Station` (comfysup.runner.station) holds what a runner keeps from one attempt to the
next (settings, queue, result store, the server's client and its kept WebSocket, peers' clients, the
runner's hooks and clocks); the values an attempt returns are in comfysup.runner.result.
An :class:`Attempt` lives for one attempt: ``Attempt(station, claim, ...).run()`` returns an
:class:`AttemptResult`: the outcome it recorded and, when the runner goes on, the jobs it took ahead (claimed,
and maybe already posted), which the runner hands to the next ``Attempt`` as values. What the follow loop reads
is fed to the run's pure protocol machine (comfysup.runner.machine); the attempt is its driver, carrying out
the actions it returns.
"""

from __future__ import annotations

import contextlib
import logging
from functools import partial
from typing import Any

from comfysup.comfy import ComfyError, MalformedAnswer, PermanentError, deadline
from comfysup.comfy.history import unlisted_savers
from comfysup.errors import LeaseLost, QueueError
from comfysup.queue.base import Claim, Output, Queue
from comfysup.runner import download, memory
from comfysup.runner import outputs as job_outputs
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.catchup import catch_up
from comfysup.runner.driver import FollowDriver
from comfysup.runner.interrupt import Interrupter
from comfysup.runner.machine import Limits, Over
from comfysup.runner.post import post_prompt
from comfysup.runner.record import Progress, record
from comfysup.runner.result import Ahead, AheadAsks, AttemptResult, Ending, Outcome
from comfysup.runner.retry import Failure, decide, gave_up
from comfysup.runner.running import Context, Heartbeat, Run, ShieldedQueue, Stop, redactor_of
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.stuck import STUCK_KIND
from comfysup.runner.trace import Trace

__all__ = ["Attempt", "AttemptResult", "AttemptSettings", "Ending", "Outcome", "Station"]
"""Outcome and the rest are also importable from here, where the supervisor and tests find them."""

log = logging.getLogger("comfysup.runner")
NEXT_START_WAIT_SECONDS = 0.02
"""How long the end of a run with a job queued ahead behind it waits for that job's start before reading its own
history: the job after it is queued first (comfysup.runner.ahead), since the server needs it next."""
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
      the queued one runs, one more is queued behind that one before this one's files are downloaded, and
      handed to the next attempt with it;
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
        self.cancel_requested = claim.cancel_requested
        self.trace = Trace.start(claim.workflow, self.taken.claimed_at if self.taken else station.wall())
        self.ctx = Context(station, self.s, claim, self.queue, self.client, self.clock, station.wall, self.trace)
        """What each step reads (comfysup.runner.running.Context)."""
        self.ahead = AheadJobs(self.ctx, asks or AheadAsks(), taken[1] if len(taken) > 1 else None,
                               interrupt=self._interrupt)
        """The jobs this attempt takes ahead (comfysup.runner.ahead)."""
        self.interrupter = Interrupter(self.ctx, self.heartbeat, self.ahead.renew, self.ahead.withdraw_next)
        self.progress = Progress(self.ctx)
        self.driver = FollowDriver(self.ctx, self.ahead, self.heartbeat, self.progress, self.limits, self.replay,
                                   self._interrupt_to_end, self._started)
        """What follows a run: the driver of its machine (comfysup.runner.driver)."""
        self.live: Run | None = None
        """The prompt of this job known to be on a server (posted or followed), to stop if the queue goes."""
        self.timeout_due: deadline.Due | None = None
        """The alarm of the job's timeout, while the steps run under it."""
        self.oom_retried = False
        """The job was posted once more on this server after an out-of-memory error (comfysup.runner.memory)."""

    def run(self) -> AttemptResult:
        """Run the attempt (once) and record its outcome; LeaseLost at any point means: stop, write nothing."""
        try:
            outcome = self._outcome()
            outcome.reason = self.redact(outcome.reason)
            record(self.ctx, outcome, self.ahead, self.redact)
            if outcome.state is Ending.DONE:  # a dead job's run stays: a person's retry adopts it from /history
                download.remove_job_folders(self.ctx)
            with contextlib.suppress(QueueError):  # best-effort: the next post evicts again
                self.station.inputs.trim()  # its inputs may go now
        except LeaseLost as exc:
            outcome = Outcome(Ending.LOST, str(exc), kind="lease_lost")
        except QueueError as exc:
            self._interrupt(self.live, renew=False)
            if self.live is not None and self.live.stream is not None:
                self.live.stream.close()  # idempotent; _attempt did not get the run when record_prompt failed
            outcome = Outcome(Ending.LOST, f"the queue did not answer ({exc}); the prompt was interrupted and "
                              "nothing was recorded: the job comes back when its lease expires",
                              kind="queue_unavailable")
        return AttemptResult(outcome, tuple(self.ahead.jobs))

    def _outcome(self) -> Outcome:
        """The attempt's outcome, whatever ended it (a lost lease or queue aside: those end it unrecorded)."""
        try:
            return self._attempt()
        except (LeaseLost, QueueError):
            raise
        except deadline.DeadlineExceeded as exc:  # one that fell outside the steps (their own ends them)
            with deadline.suspended():
                self._interrupt(self.live)
            if exc.kind == "stop":
                return Outcome(Ending.RELEASED, f"interrupted by {exc.what}; attempt not counted", kind="shutdown")
            return self._failed(Failure("timeout", f"timed out ({exc.what})", True))
        except Exception as exc:  # a bug of ours: this attempt fails, the runner lives on
            log.exception("job %s attempt %d: internal error", self.claim.id, self.claim.attempt)
            with deadline.suspended():
                self._interrupt(self.live)
            return self._failed(Failure("internal", f"comfysup internal error: {type(exc).__name__}: {exc}",
                                        transient=True))

    def _attempt(self) -> Outcome:
        """The attempt under its deadline: a read that blocks or trickles past the job's timeout (or a stop's
        grace) is interrupted by the alarm, and the prompt is interrupted after it."""
        try:
            with deadline.until(self.deadline + ALARM_SLACK_SECONDS,
                                f"the job's timeout of {self.s.timeout_seconds:g} s", kind="attempt") as due:
                self.timeout_due = due
                return self._steps()
        except deadline.DeadlineExceeded as exc:
            phase = self.trace.phases[-1][0] if self.trace.phases else "starting"
            stuck = self._interrupt(self.live)
            if self.live is not None and self.live.stream is not None and self.live.stream is not self.client.stream:
                self.live.stream.close()
            if exc.kind == "stop":
                return Outcome(Ending.RELEASED, f"interrupted by a stop ({exc.what}) while {phase}; attempt not "
                               "counted", kind="shutdown")
            if stuck:
                return self._failed(Failure(STUCK_KIND, stuck, transient=True))
            return self._failed(Failure("timeout", f"timed out after {self.s.timeout_seconds:g} s (while {phase}: "
                                        "the server did not answer in time)", transient=True))

    def _steps(self) -> Outcome:
        run: Run | None = None
        try:
            run = self._start()
            if run is None:
                return Outcome(Ending.DEAD, gave_up(self.claim.attempt - 1, self.claim.last_reason), kind="gave_up")
            run, entry = self._follow_recovering(run)
            return self._over(run, entry)
        except Stop as stop:
            return stop.outcome
        except ComfyError as exc:
            memory.device_lost(exc.kind, exc.reason, self.s.server, self.station.memory)
            return self._failed(Failure(exc.kind, exc.reason, transient=not isinstance(exc, PermanentError)))
        finally:
            if self.live is not None and self.live.stream is not None and self.live.stream is not self.client.stream:
                self.live.stream.close()  # a followed run's own socket; the client's kept one stays open

    def _start(self) -> Run | None:
        """Steps 1 and 2: the run of this job to follow (caught up, or posted now); None: out of attempts."""
        run, followed = catch_up(self.ctx, self.taken)
        if followed:  # still in a server's queue: where, and its number, recorded before anything else
            assert run is not None and run.number is not None
            self.live = run
            self.queue.leases.record_prompt(self.claim, run.server, run.number, run.client.url,
                                            waiting=not run.m.started)
            self.waiting = not run.m.started  # still pending in that server's queue: shown posted until it runs
        if self.cancel_requested:
            self._interrupt(run)
            raise Stop(Outcome(Ending.CANCELLED, "cancelled by user", kind="cancelled"))
        if run is None and self.claim.attempt > self.s.policy.attempts:
            return None
        return run if run is not None else self._post()

    def _over(self, run: Run, entry: dict[str, Any]) -> Outcome:
        """Steps 5 and 6 of a run that succeeded: the jobs taken ahead first, then its files."""
        if self.waiting:  # over (adopted, or its start was not read): no longer waiting for its server
            self._executes()
        run.m.step(OVER)
        if self.ahead.may_queue_behind_next(run):
            self.ahead.queue_behind_next(run, partial(self.driver.drain, run))
        if self.ahead.may_hand_off(run):
            self.ahead.hand_off()
        if run.from_disk is None and (unlisted := unlisted_savers(entry, self.claim.workflow)):
            raise MalformedAnswer(f"server sent a history entry of a successful run that lists no file of "
                                  f"{', '.join(unlisted[:5])}")
        outputs = self._download(run, entry)
        return Outcome(Ending.DONE, kind="done", outputs=outputs, adopted=run.adopted_entry is not None,
                       adopted_from_disk=run.from_disk is not None,
                       server_free=run.m.end_seen and run.m.queue_remaining == 0 and run.client is self.client)

    def _follow_recovering(self, run: Run) -> tuple[Run, dict[str, Any]]:
        """Follow ``run``; after an out-of-memory error, POST /free and post the job once more on this server, or
        give it back uncounted (comfysup.runner.memory.after_oom says which, and when neither). Returns the run
        that succeeded."""
        try:
            return run, self.driver.follow(run)
        except ComfyError as exc:
            retried = self.oom_retried or (self.claim.last_reason or "").startswith(memory.RELEASED_REASON)
            action = memory.after_oom(exc.kind, retried, run.client is self.client, self.ahead.next_posted is not None)
            if action is None:
                raise
            self.oom_retried = True
            if not memory.free(self.client.free, self.s.server, self.station.memory):
                raise
            self.station.memory.count("oom_retries")
            if action == memory.RELEASE:
                raise Stop(Outcome(Ending.RELEASED, f"{memory.RELEASED_REASON} (last: {exc.reason})",
                                   kind="oom")) from exc
            if run.stream is not None and run.stream is not run.client.stream:
                run.stream.close()
            log.info("job %s attempt %d on %s: out of memory; POST /free, then posted again on this server "
                     "(not counted as an attempt)", self.claim.id, self.claim.attempt, self.s.server,
                     extra={"event": "oom_retry"})
        again = self._post(again=True)
        return again, self.driver.follow(again)

    def _failed(self, failure: Failure) -> Outcome:
        decision = decide(self.s.policy, self.claim.attempt, failure)
        if decision.dead:
            return Outcome(Ending.DEAD, decision.reason, kind=failure.kind)
        return Outcome(Ending.RETRY, decision.reason, kind=failure.kind, delay_seconds=decision.delay_seconds)

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
        self.queue.leases.record_prompt(self.claim, self.s.server, number, self.s.url)  # on a free server: it executes
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
