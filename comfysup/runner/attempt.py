"""One attempt at one job, step by step (DESIGN.md "One attempt"), ending in exactly one recorded outcome.

1. Catch up: a prompt of an earlier attempt that finished is adopted from /history; one still queued is
   followed where it is. Nothing is posted twice while a run of it may still exist.
2. POST /prompt with prompt_id = job id on the runner's kept WebSocket (one client id per runner, emptied
   of earlier messages; a job posted again gets a fresh client id, so none of its earlier run's messages
   can pass for this run's); record the returned number, which tells this run's history entry from
   others of the same id.
3. Follow events after this run's execution_start; reconnect a dropped socket with the same client id;
   read /history when ComfyUI says the run ended (``executing`` with node None, sent after it wrote the
   history), every poll_seconds, and after each reconnection (success is announced before the history
   is written, and nothing is replayed to a reconnected socket). Renew the lease from this loop.
4. On the deadline (or a cancel, or the end of a graceful stop's grace) interrupt the prompt, delete it
   from the queue and wait until it has left /queue before the attempt ends.
5. Download outputs to temporary names, then rename. 6. Record done, fenced (with the next claim, in one
   transaction, when the runner goes on: see comfysup.runner.loop).

Every write to the queue is fenced; a LeaseLost anywhere ends the attempt without writing anything. A
queue that does not answer (QueueError) ends it the same way, after interrupting the prompt: the attempt
can no longer renew its lease, and the job must not still run here when the lease hands it to another
runner, perhaps on another machine that cannot see this server.

The shape: a :class:`Station` (comfysup.runner.station) holds what a runner keeps from one attempt to the
next (settings, queue, result store, the server's client and its kept WebSocket, peers' clients, the
runner's hooks and clocks); the values an attempt returns are in comfysup.runner.result.
An :class:`Attempt` lives for one attempt: ``Attempt(station, claim, ...).run()`` returns an
:class:`AttemptResult` — the outcome it recorded and, when the runner goes on, the next job it claimed
(and maybe already posted), which the runner hands to the next ``Attempt`` as a value.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from comfysup.errors import LeaseLost, QueueError
from comfysup.logs import job_context
from comfysup.queue.base import Claim, Queue
from comfysup.redact import Redactor
from comfysup.runner import deadline
from comfysup.runner import outputs as job_outputs
from comfysup.runner.catchup import CatchingUp
from comfysup.runner.client import (
    ComfyError,
    MalformedAnswer,
    PermanentError,
    ServerUnavailable,
    SocketLost,
    new_client_id,
)
from comfysup.runner.ending import Ending
from comfysup.runner.history import judge, prompt_number, unlisted_savers
from comfysup.runner.result import AheadJob, AttemptResult, NextClaim, NextJob, Outcome, Posted
from comfysup.runner.retry import Failure, decide, execution_failure, gave_up
from comfysup.runner.running import Run, ShieldedQueue, Stop
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.stuck import STUCK_KIND
from comfysup.runner.trace import Trace

__all__ = ["Attempt", "AttemptResult", "AttemptSettings", "NextClaim", "NextJob", "Outcome", "Posted", "Station"]
"""Outcome, Posted and the rest are also importable from here, where the supervisor and tests find them."""

log = logging.getLogger("comfysup.runner")
HISTORY_AFTER_SUCCESS_SECONDS = 0.05
ALARM_SLACK_SECONDS = 1.0
"""The job's deadline is checked at every wake-up of the follow loop, which interrupts the prompt then; the
alarm (comfysup.runner.deadline) falls this much later, for what no wake-up reaches: a read that blocks, a
download that trickles."""
PROGRESS_WRITE_SECONDS = 1.0
"""At most one progress write per second: a sampler's steps come faster than a queue row should change."""


class Attempt(CatchingUp, Ending):
    """One attempt at one job, from its claim to its recorded outcome; made for that attempt and dropped.

    The server idles from the end of one prompt to the start of the next, so the next job is started as
    early as it safely can be (given ``next_job``):
    - queued ahead (given ``ahead``, [runner] queue_ahead): once this prompt executes, one more job is
      claimed and posted behind it, so ComfyUI starts it the moment this one ends, whatever this runner is
      doing then. At most one: it is asked once, and only while the server holds no other waiting prompt of
      ours. Its lease is renewed here; a cancel of it, or a graceful stop before it started, takes it out of
      the server's queue (and records the cancel, or releases it uncounted);
    - the hand-off: when the prompt succeeded and the server's broadcast said its queue is empty, the next
      job is claimed and posted at once, and this job's outputs are downloaded and recorded while the
      server runs it (returned as ``AttemptResult.posted``, given to the next attempt as ``posted``);
    - otherwise a done is recorded together with the next claim, in one transaction.
    """

    def __init__(self, station: Station, claim: Claim, next_job: NextJob | None = None,
                 posted: Posted | None = None, ahead: AheadJob | None = None) -> None:
        self.station = station
        self.s = station.settings
        self.queue: Queue = ShieldedQueue(station.queue)  # type: ignore[assignment]
        self.client = station.client
        self.clock = station.clock
        self.wall = station.wall
        self.claim = claim
        self.next_job = next_job
        self.posted_in = posted if posted is not None and posted.claim_id == claim.id else None
        self.posted_out: Posted | None = None
        self.next_claim: Claim | None = None
        self.next_renewed = 0.0
        self.handed_off = False
        self.ahead = ahead
        self.replay = list(self.posted_in.events) if self.posted_in is not None else []
        """Messages of this job's prompt read by the attempt that queued it: handled before the socket's."""
        self.ahead_tried = False
        """A job was asked for to queue behind this one (once an attempt, as soon as this one executes)."""
        """The hand-off was tried (once an attempt: as the end is read, or after the history at the latest)."""
        self.redact = Redactor.for_job(claim.workflow, claim.extra_data)
        self.deadline = self.clock() + self.s.timeout_seconds
        self.next_heartbeat = self.clock() + self.s.heartbeat_seconds
        self.cancel_requested = claim.cancel_requested
        self.trace = Trace.start(claim.workflow, self.posted_in.claimed_at if self.posted_in else self.wall())
        self.progress_written_at = float("-inf")
        self.live: Run | None = None
        """The prompt of this job known to be on a server (posted or followed), to stop if the queue goes."""

    def run(self) -> AttemptResult:
        """Run the attempt (once) and record its outcome; LeaseLost at any point means: stop, write nothing."""
        try:
            try:
                outcome = self._attempt()
            except (LeaseLost, QueueError):
                raise
            except deadline.DeadlineExceeded as exc:  # one that fell outside the steps (their own ends them)
                with deadline.suspended():
                    self._interrupt(self.live)
                outcome = Outcome("released", f"interrupted by {exc.what}; attempt not counted", kind="shutdown") \
                    if exc.kind == "stop" else self._failed(Failure("timeout", f"timed out ({exc.what})", True))
            except Exception as exc:  # a bug of ours: this attempt fails, the runner lives on
                log.exception("job %s attempt %d: internal error", self.claim.id, self.claim.attempt)
                with deadline.suspended():
                    self._interrupt(self.live)
                outcome = self._failed(Failure("internal", f"comfysup internal error: {type(exc).__name__}: {exc}",
                                               transient=True))
            outcome.reason = self.redact(outcome.reason)
            self._record(outcome)
            if outcome.state == "done":  # a dead job's run stays: a person's retry adopts it from /history
                self._remove_job_folders()
        except LeaseLost as exc:
            return AttemptResult(Outcome("lost", str(exc), kind="lease_lost"), self.next_claim, self.posted_out)
        except QueueError as exc:
            self._interrupt(self.live, renew=False)
            if self.live is not None and self.live.stream is not None:
                self.live.stream.close()  # idempotent; _attempt did not get the run when record_prompt failed
            return AttemptResult(
                Outcome("lost", f"the queue did not answer ({exc}); the prompt was interrupted and nothing was "
                        "recorded: the job comes back when its lease expires", kind="queue_unavailable"),
                self.next_claim, self.posted_out)
        return AttemptResult(outcome, self.next_claim, self.posted_out)

    def _record(self, o: Outcome) -> None:
        """The outcome, its reason class and the attempt's trace, in one fenced write."""
        self.trace.phase("recorded", self.wall())
        trace = self.trace.as_dict()
        if o.state == "done":
            more = self.next_job(self.claim, o) if self.next_job is not None and self.next_claim is None else None
            if more is not None:
                self.next_claim = self.queue.complete_and_claim(
                    self.claim, o.outputs, more.owner, more.server, more.lease_seconds, trace=trace,
                    prefer_model=more.prefer_model, max_wait_seconds=more.max_wait_seconds,
                    catalogue=more.catalogue)
            else:
                self.queue.complete(self.claim, o.outputs, trace=trace)
        elif o.state == "retry":
            self.queue.retry_later(self.claim, time.time() + o.delay_seconds, o.reason, kind=o.kind, trace=trace)
        elif o.state == "dead":
            self.queue.dead(self.claim, o.reason, kind=o.kind, trace=trace)
        elif o.state == "cancelled":
            self.queue.cancelled(self.claim, o.reason, trace=trace)
        elif o.state == "released":
            self.queue.release(self.claim, o.reason, count_attempt=False, kind=o.kind, trace=trace)

    def _write_progress(self) -> None:
        """The live progress, when it moved and a second has passed since the last write (fenced)."""
        if not self.trace.changed or self.clock() - self.progress_written_at < PROGRESS_WRITE_SECONDS:
            return
        progress = self.trace.progress()
        self.trace.changed = False
        if progress is not None:
            self.progress_written_at = self.clock()
            self.queue.set_progress(self.claim, progress)

    def _attempt(self) -> Outcome:
        """The attempt under its deadline: a read that blocks or trickles past the job's timeout (or a stop's
        grace) is interrupted by the alarm, and the prompt is interrupted after it."""
        try:
            with deadline.until(self.deadline + ALARM_SLACK_SECONDS,
                                f"the job's timeout of {self.s.timeout_seconds:g} s", kind="attempt"):
                return self._steps()
        except deadline.DeadlineExceeded as exc:
            phase = self.trace.phases[-1][0] if self.trace.phases else "starting"
            stuck = self._interrupt(self.live)
            if self.live is not None and self.live.stream is not None and self.live.stream is not self.client.stream:
                self.live.stream.close()
            if exc.kind == "stop":
                return Outcome("released", f"interrupted by a stop ({exc.what}) while {phase}; attempt not counted",
                               kind="shutdown")
            if stuck:
                return self._failed(Failure(STUCK_KIND, stuck, transient=True))
            return self._failed(Failure("timeout", f"timed out after {self.s.timeout_seconds:g} s (while {phase}: "
                                        "the server did not answer in time)", transient=True))

    def _steps(self) -> Outcome:
        run: Run | None = None
        try:
            run = self._catch_up()
            if self.cancel_requested:
                self._interrupt(run)
                return Outcome("cancelled", "cancelled by user", kind="cancelled")
            if run is None:
                if self.claim.attempt > self.s.policy.attempts:
                    return Outcome("dead", gave_up(self.claim.attempt - 1, self.claim.last_reason), kind="gave_up")
                run = self._post()
            entry = self._follow(run)
            if self._may_hand_off(run):
                self._hand_off()
            if run.from_disk is None and (unlisted := unlisted_savers(entry, self.claim.workflow)):
                raise MalformedAnswer(f"server sent a history entry of a successful run that lists no file of "
                                      f"{', '.join(unlisted[:5])}")
            outputs = self._download(run, entry)
            return Outcome("done", kind="done", outputs=outputs, adopted=run.adopted_entry is not None,
                           adopted_from_disk=run.from_disk is not None,
                           server_free=run.end_seen and run.queue_remaining == 0 and run.client is self.client)
        except Stop as stop:
            return stop.outcome
        except ComfyError as exc:
            return self._failed(Failure(exc.kind, exc.reason, transient=not isinstance(exc, PermanentError)))
        finally:
            if run is not None and run.stream is not None and run.stream is not run.client.stream:
                run.stream.close()  # a followed run's own socket; the client's kept one stays open

    def _failed(self, failure: Failure) -> Outcome:
        decision = decide(self.s.policy, self.claim.attempt, failure)
        if decision.dead:
            return Outcome("dead", decision.reason, kind=failure.kind)
        return Outcome("retry", decision.reason, kind=failure.kind, delay_seconds=decision.delay_seconds)

    # -- 2. post ----------------------------------------------------------------------------------------

    def _post(self) -> Run:
        if self.posted_in is not None:  # posted by the previous attempt as its own run ended
            posted, self.posted_in = self.posted_in, None
            if posted.error is not None:
                raise posted.error
            self.trace.phase("posted", posted.posted_at)
            self.live = Run(self.client, self.s.server, posted.number, stream=self.client.own_stream(drain=False),
                            started=posted.started)
            return self.live
        # The kept socket, emptied of what earlier prompts left in it; a job posted again gets a new client
        # id, so no message of its earlier run can be read as one of this run.
        stream = self.client.own_stream(fresh=self.claim.attempt > 1)
        if self.s.server in self.s.output_dirs and (self.claim.attempt > 1 or self.claim.last_server is not None):
            # Leftovers of an earlier run must not mix with this run's files in a later adoption.
            job_outputs.discard(self.s.output_dirs, self.s.server, self.claim.id)
        number = self._post_prompt(self.claim, stream.client_id)
        log.info("job %s attempt %d on %s: POST /prompt 200", self.claim.id, self.claim.attempt, self.s.server,
                 extra={"event": "posted"})
        self.trace.phase("posted", self.wall())
        self.live = Run(self.client, self.s.server, number, stream=stream)
        self.queue.record_prompt(self.claim, self.s.server, number, self.s.url)
        return self.live

    def _may_hand_off(self, run: Run) -> bool:
        """This run has ended on its server (``executing`` with node None), the server's queue is empty, and
        it was followed on this runner's own socket: the server is free for the next job."""
        return (self.next_job is not None and not self.handed_off and self.next_claim is None and run.end_seen
                and run.queue_remaining == 0 and run.client is self.client)

    def _may_queue_ahead(self, run: Run) -> bool:
        """This run executes on this runner's own server (execution_start seen), nothing was claimed behind
        it yet, and no stop has begun: one more job may wait in the server's queue behind it."""
        return (self.ahead is not None and not self.ahead_tried and self.next_claim is None and run.started
                and not run.end_seen and run.client is self.client and self.station.stop_deadline() is None)

    def _hand_off(self, run: Run | None = None) -> None:
        """Claim the next job and post it now, before this one's outputs are downloaded and recorded: the
        server runs it meanwhile instead of waiting. As in an attempt's own post, the claim is durable
        before the prompt is posted and its number is recorded right after; a job that may have an earlier
        run somewhere is claimed here but posted by its own attempt, which looks for that run first."""
        claimed_at = self.wall()
        if run is not None:  # queued ahead, behind this run (which executes now)
            self.ahead_tried = True
            more = self.ahead(self.claim, run.queue_remaining) if self.ahead else None
        else:
            self.handed_off = True
            more = self.next_job(self.claim, Outcome("done", kind="done", server_free=True)) if self.next_job else None
        if more is None:
            return
        nxt = self.queue.claim(more.owner, more.server, more.lease_seconds, prefer_model=more.prefer_model,
                               max_wait_seconds=more.max_wait_seconds, catalogue=more.catalogue)
        if nxt is None:
            return
        self.next_claim, self.next_renewed = nxt, self.clock()
        if (nxt.attempt != 1 or nxt.last_server is not None or nxt.cancel_requested or not more.runnable(nxt)
                or self._ran_here(nxt)):
            return
        try:
            stream = self.client.own_stream()
        except ComfyError:
            return  # nothing was posted: the next attempt posts it
        try:
            number = self._post_prompt(nxt, stream.client_id)
        except ComfyError as exc:
            self.posted_out = Posted(nxt.id, claimed_at, self.wall(), error=exc)
            return
        self.posted_out = Posted(nxt.id, claimed_at, self.wall(), number=number)
        with job_context(nxt.id, nxt.attempt, Redactor.for_job(nxt.workflow, nxt.extra_data)):  # its own line
            log.info("job %s attempt %d on %s: POST /prompt 200 (%s)", nxt.id, nxt.attempt, self.s.server,
                     f"queued behind job {self.claim.id}" if run is not None else
                     f"while job {self.claim.id} is downloaded", extra={"event": "posted"})
        try:
            self.queue.record_prompt(nxt, self.s.server, number, self.s.url)
        except LeaseLost:
            self._drop_next()

    def _ran_here(self, nxt: Claim) -> bool:
        """Whether the server already holds a history entry of the next job's id (run for another queue): its
        attempt adopts it instead of posting it. One GET /history/{id} (its /queue is known empty from the
        broadcast); a server that does not answer leaves the question to the attempt."""
        try:
            return self.client.history(nxt.id, self.s.max_files_per_job) is not None
        except ComfyError:
            return True

    def _drop_next(self) -> None:
        """The next job's lease is gone (another runner may hold it now): its prompt must not run here."""
        nxt, posted = self.next_claim, self.posted_out
        self.next_claim = self.posted_out = None
        if nxt is not None and posted is not None and posted.number is not None:
            with job_context(nxt.id, nxt.attempt):
                log.warning("job %s: lost its lease before its attempt began; interrupting its prompt", nxt.id)
            self._interrupt(Run(self.client, self.s.server, posted.number), prompt_id=nxt.id)

    def _withdraw_next(self, cancelled: bool) -> None:
        """Take the job queued behind this one back: out of the server's queue (interrupted, should it have
        started in between), then recorded cancelled (a user's cancel) or released without counting the
        attempt (a graceful stop: it never ran)."""
        nxt, posted = self.next_claim, self.posted_out
        if nxt is None:
            return
        self.next_claim = self.posted_out = None
        if posted is not None and posted.number is not None:
            self._interrupt(Run(self.client, self.s.server, posted.number), prompt_id=nxt.id)
        with job_context(nxt.id, nxt.attempt, Redactor.for_job(nxt.workflow, nxt.extra_data)):
            try:
                if cancelled:
                    self.queue.cancelled(nxt, "cancelled by user (while queued)")
                else:
                    self.queue.release(nxt, "the runner stopped before it started; attempt not counted",
                                       count_attempt=False, kind="shutdown")
            except LeaseLost:
                return
            log.info("job %s: %s", nxt.id, "cancelled while queued" if cancelled else
                     "taken out of the server's queue by a stop and released, attempt not counted",
                     extra={"event": "cancelled" if cancelled else "released",
                            "kind": "cancelled" if cancelled else "shutdown"})

    # -- 3. follow --------------------------------------------------------------------------------------

    def _follow(self, run: Run) -> dict[str, Any]:
        """Until this run's history entry says success; raises _Stop or ComfyError otherwise."""
        if run.adopted_entry is not None:
            return run.adopted_entry
        # A followed (caught-up) run may have finished already; a fresh one is announced on the socket.
        next_poll = self.clock() + (0.0 if run.stream is None else self.s.poll_seconds)
        unreachable_since: float | None = None
        while True:
            now = self.clock()
            self._checkpoints(run, now)
            if now >= next_poll:
                try:
                    entry = self._poll(run)
                    unreachable_since = None
                except ServerUnavailable as exc:
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since >= self.s.server_lost_seconds:
                        raise ServerUnavailable(f"the ComfyUI server died or stopped answering ({exc.reason})",
                                                "server_died") from exc
                    entry = None
                if entry is not None:
                    return entry
                next_poll = now + (HISTORY_AFTER_SUCCESS_SECONDS if run.success_seen else self.s.poll_seconds)
            wait = max(0.0, min(next_poll, self.deadline, self.next_heartbeat) - self.clock())
            message = self._receive(run, wait)
            poll_in = None if message is None else self._on_message(run, message)
            if self._may_queue_ahead(run):
                self._hand_off(run)  # this run executes: the next waits behind it in the server's queue
            if run.success_seen and self._may_hand_off(run):
                # execution_success, then the end with an empty queue: the server is idle from this moment, so
                # the next job goes to it before this run's history is read (that read costs the server a
                # round trip of idle time, and it comes next anyway).
                self._hand_off()
            if poll_in is not None:
                next_poll = min(next_poll, self.clock() + poll_in)
            self._write_progress()

    def _checkpoints(self, run: Run, now: float) -> None:
        """The deadline, the heartbeat (lease, cancel) and a graceful stop, checked on every wake-up."""
        self.station.on_alive()
        self._write_progress()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.s.heartbeat_seconds
            if self.next_claim is not None and now - self.next_renewed >= self.s.heartbeat_seconds:
                # Handed off, running on the server while this one downloads (not renewed just after its claim).
                self.next_renewed = now
                try:
                    if self.queue.heartbeat(self.next_claim, self.s.lease_seconds):
                        self._withdraw_next(cancelled=True)
                except LeaseLost:
                    self._drop_next()
            if self.queue.heartbeat(self.claim, self.s.lease_seconds):
                self._interrupt(run)
                raise Stop(Outcome("cancelled", "cancelled by user", kind="cancelled"))
        if now >= self.deadline:
            stuck = self._interrupt(run)
            raise ComfyError(stuck, STUCK_KIND) if stuck else ComfyError(
                f"timed out after {self.s.timeout_seconds:g} s", "timeout")
        stop_at = self.station.stop_deadline()
        if stop_at is not None and self.posted_out is not None and not self.posted_out.started:
            self._withdraw_next(cancelled=False)  # queued behind this one, not started: it gets no grace
        if stop_at is not None and now >= stop_at:
            self._interrupt(run)
            raise Stop(Outcome("released", "interrupted by a graceful stop; attempt not counted", kind="shutdown"))

    def _receive(self, run: Run, wait: float) -> dict[str, Any] | None:
        if self.replay:
            return self.replay.pop(0)
        if run.stream is None:
            run.stream = run.client.events(new_client_id())
            try:
                run.stream.connect()
            except SocketLost:
                run.stream = None
                time.sleep(min(wait, 0.2))
                return None
        try:
            return run.stream.recv(wait)
        except SocketLost as lost:
            # Reconnect with the same client id (the old socket is closed first), then poll /history.
            try:
                run.stream.connect()
                ok = True
            except SocketLost:
                ok = False
            self.trace.reconnected(self.wall(), ok)
            how = "reconnected with the same client id" if ok else "could not reconnect yet, trying again"
            log.warning("job %s attempt %d on %s: the WebSocket dropped (%s); %s", self.claim.id, self.claim.attempt,
                        run.server, lost.reason, how, extra={"event": "reconnected" if ok else "socket_lost"})
            if not ok:
                time.sleep(min(wait, 0.2))
            return {"type": "comfysup_reconnected", "data": {"prompt_id": self.claim.id}}

    def _on_message(self, run: Run, message: dict[str, Any]) -> float | None:
        """Handle one event; returns in how many seconds /history should be read (None: no change).

        ``execution_success`` comes before ComfyUI writes the history, ``executing`` with node None right
        after it: reading /history at the first would mostly find nothing and cost two more calls (history
        and queue), so it is read at the second, or HISTORY_AFTER_SUCCESS_SECONDS after the first at most.
        """
        kind = message.get("type")
        data = message.get("data") or {}
        if kind == "comfysup_reconnected":
            return 0.0
        if kind == "status":
            remaining = ((data.get("status") or {}).get("exec_info") or {}).get("queue_remaining")
            run.queue_remaining = remaining if isinstance(remaining, int) else None
            return None
        if data.get("prompt_id") != self.claim.id:
            if self.posted_out is not None and data.get("prompt_id") == self.posted_out.claim_id:
                # Queued ahead, it runs now: its attempt gets what was read of it here.
                self.posted_out = replace(self.posted_out, started=self.posted_out.started or kind == "execution_start",
                                          events=(*self.posted_out.events, message))
            return None
        if kind == "execution_start":
            run.started = True
        if not run.started:
            return None
        self.trace.on_event(kind, data, self.wall())
        if kind == "execution_start":
            return None
        if kind == "execution_success":
            run.success_seen = True
            return HISTORY_AFTER_SUCCESS_SECONDS
        if kind == "executing" and data.get("node") is None:
            run.end_seen = True
            return 0.0
        if kind == "execution_error":
            failure = execution_failure(data)
            raise ComfyError(failure.reason, failure.kind) if failure.transient else PermanentError(failure.reason,
                                                                                                   failure.kind)
        if kind == "execution_interrupted" and not run.interrupt_asked:
            raise ComfyError(f"execution_interrupted at node {data.get('node_id')} ({data.get('node_type')}), "
                             "not asked for by comfysup", "interrupted")
        return None

    def _poll(self, run: Run) -> dict[str, Any] | None:
        """This run's history entry when it succeeded; None while it runs. Raises on failure or loss."""
        entry = self._own_entry(run)
        if entry is not None:
            return judge(entry)
        if any(e.prompt_id == self.claim.id for e in run.client.queue()):
            return None
        # Not in the queue: it finished between the two reads (the history is written before the prompt
        # leaves the queue), or the server lost it.
        entry = self._own_entry(run)
        if entry is not None:
            return judge(entry)
        # The server answered: this is certain, not a reason to wait for it to come back.
        raise ComfyError("the prompt is gone from the server's queue without a history entry "
                         "(the ComfyUI server restarted)", "server_died")

    def _own_entry(self, run: Run) -> dict[str, Any] | None:
        entry = run.client.history(self.claim.id, self.s.max_files_per_job)
        if entry is not None and (run.number is None or prompt_number(entry) == run.number):
            return entry
        return None
