"""One attempt at one job, step by step (DESIGN.md "One attempt"), ending in exactly one recorded outcome.

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

import contextlib
import logging
import time
from typing import Any

from comfysup.comfy import ComfyError, MalformedAnswer, PermanentError, ServerUnavailable, deadline
from comfysup.comfy.history import unlisted_savers
from comfysup.errors import LeaseLost, QueueError
from comfysup.queue.base import Claim, Output, Queue
from comfysup.runner import download, follow, memory
from comfysup.runner import outputs as job_outputs
from comfysup.runner.catchup import catch_up
from comfysup.runner.follow import HISTORY_AFTER_SUCCESS_SECONDS
from comfysup.runner.interrupt import Interrupter
from comfysup.runner.nextjob import EarlyJobs
from comfysup.runner.post import post_prompt
from comfysup.runner.result import AheadJob, AttemptResult, Early, NextClaim, NextJob, Outcome, Posted
from comfysup.runner.retry import Failure, decide, gave_up
from comfysup.runner.running import Context, Heartbeat, Run, ShieldedQueue, Stop, redactor_of
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.stuck import STUCK_KIND
from comfysup.runner.trace import Trace

__all__ = ["Attempt", "AttemptResult", "AttemptSettings", "NextClaim", "NextJob", "Outcome", "Posted", "Station"]
"""Outcome, Posted and the rest are also importable from here, where the supervisor and tests find them."""

log = logging.getLogger("comfysup.runner")
NEXT_START_WAIT_SECONDS = 0.02
"""How long the end of a run with a job queued behind it waits for that job's start before reading its own
history: the job after it is queued first (comfysup.runner.nextjob), since the server needs it next."""
ALARM_SLACK_SECONDS = 1.0
"""The job's deadline is checked at every wake-up of the follow loop, which interrupts the prompt then; the
alarm (comfysup.comfy.deadline) falls this much later, for what no wake-up reaches: a read that blocks, a
download that trickles."""
ERROR_CHARS = {"message": 2000, "traceback": 8000}
"""What of ComfyUI's exception message and traceback an attempt's trace keeps (other fields: 200 characters)."""
PROGRESS_WRITE_SECONDS = 1.0
"""At most one progress write per second: a sampler's steps come faster than a queue row should change."""


class Attempt:
    """One attempt at one job, from its claim to its recorded outcome; made for that attempt and dropped.

    The server idles from the end of one prompt to the start of the next, so the next job is started as
    early as it safely can be (given ``next_job``):
    - queued ahead (given ``ahead``, [runner] queue_ahead): once this prompt executes, one more job is
      claimed and posted behind it, so ComfyUI starts it the moment this one ends, whatever this runner is
      doing then. At most one: it is asked once, and only while the server holds no other waiting prompt of
      ours. Its lease is renewed here; a cancel of it, or a graceful stop before it started, takes it out of
      the server's queue (and records the cancel, or releases it uncounted). Once this prompt has ended and
      the queued one runs, one more is queued behind that one before this one's files are downloaded
      (comfysup.runner.nextjob), and handed to the next attempt as its own queued job;
    - the hand-off: when the prompt succeeded and the server's broadcast said its queue is empty, the next
      job is claimed and posted at once, and this job's outputs are downloaded and recorded while the
      server runs it (returned as ``AttemptResult.posted``, given to the next attempt as ``posted``);
    - otherwise a done is recorded together with the next claim, in one transaction.
    """

    def __init__(self, station: Station, claim: Claim, next_job: NextJob | None = None,
                 posted: Posted | None = None, ahead: AheadJob | None = None, behind: Early | None = None) -> None:
        self.station = station
        self.s = station.settings
        self.queue: Queue = ShieldedQueue(station.queue)  # type: ignore[assignment]
        self.client = station.client
        self.clock = station.clock
        self.claim = claim
        self.posted_in = posted if posted is not None and posted.claim_id == claim.id else None
        self.replay = list(self.posted_in.events) if self.posted_in is not None else []
        """Messages of this job's prompt read by the attempt that queued it: handled before the socket's."""
        self.waiting = claim.waiting or (self.posted_in is not None and self.posted_in.waiting)
        """The queue shows the job as posted (waiting for its server) until this attempt says it executes."""
        self.redact = redactor_of(claim)
        self.deadline = self.clock() + self.s.timeout_seconds
        self.heartbeat = Heartbeat(self.s.heartbeat_seconds, self.clock() + self.s.heartbeat_seconds)
        self.cancel_requested = claim.cancel_requested
        self.trace = Trace.start(claim.workflow, self.posted_in.claimed_at if self.posted_in else station.wall())
        self.ctx = Context(station, self.s, claim, self.queue, self.client, self.clock, station.wall, self.trace)
        """What each step reads (comfysup.runner.running.Context)."""
        self.early = EarlyJobs(self.ctx, next_job, ahead, behind, interrupt=self._interrupt)
        """The jobs claimed and posted early by this attempt (comfysup.runner.nextjob)."""
        self.interrupter = Interrupter(self.ctx, self.heartbeat, self.early.renew_early, self.early.withdraw_next)
        self.progress_written_at = self.clock()
        """The first progress is written a second into the attempt: a job that ends sooner costs no write for it
        (its trace, recorded with its end, has the whole of it)."""
        self.preview_written_at = float("-inf")
        """When the last preview was written ([runner] preview_seconds apart)."""
        self.run_over = False
        """This job's run has ended on its server (its history entry was read): a job behind it may run now."""
        self.live: Run | None = None
        """The prompt of this job known to be on a server (posted or followed), to stop if the queue goes."""
        self.timeout_due: deadline.Due | None = None
        """The alarm of the job's timeout, while the steps run under it."""
        self.oom_retried = False
        """The job was posted once more on this server after an out-of-memory error (comfysup.runner.memory)."""

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
                download.remove_job_folders(self.ctx)
            with contextlib.suppress(QueueError):  # best-effort: the next post evicts again
                self.station.inputs.trim()  # its inputs may go now
        except LeaseLost as exc:
            return AttemptResult(Outcome("lost", str(exc), kind="lease_lost"), self.early.next_claim,
                                 self.early.posted_out, self.early.behind())
        except QueueError as exc:
            self._interrupt(self.live, renew=False)
            if self.live is not None and self.live.stream is not None:
                self.live.stream.close()  # idempotent; _attempt did not get the run when record_prompt failed
            return AttemptResult(
                Outcome("lost", f"the queue did not answer ({exc}); the prompt was interrupted and nothing was "
                        "recorded: the job comes back when its lease expires", kind="queue_unavailable"),
                self.early.next_claim, self.early.posted_out, self.early.behind())
        return AttemptResult(outcome, self.early.next_claim, self.early.posted_out, self.early.behind())

    def _record(self, o: Outcome) -> None:
        """The outcome, its reason class and the attempt's trace, in one fenced write."""
        self.trace.phase("recorded", self.ctx.wall())
        trace = self.trace.as_dict()
        if "error" in trace:  # ComfyUI's text, as the reason: redacted first, then cut
            error = trace["error"]
            trace["error"] = {k: self.redact(v, ERROR_CHARS.get(k, 200)) if isinstance(v, str) else v
                              for k, v in error.items()}
        early = self.early
        if o.state == "done":
            more = early.next_job(self.claim, o) if early.next_job is not None and early.next_claim is None else None
            if more is not None:
                early.next_claim = self.queue.leases.complete_and_claim(
                    self.claim, o.outputs, more.owner, more.server, more.lease_seconds, trace=trace,
                    prefer_model=more.prefer_model, max_wait_seconds=more.max_wait_seconds,
                    catalogue=more.catalogue, url=self.s.url)
            else:
                started = early.started_behind()  # the job queued behind this one executes: said in this end
                self.queue.leases.complete(self.claim, o.outputs, trace=trace, started=started)
                if started is not None:
                    early.start_recorded()
        elif o.state == "retry":
            self.queue.leases.retry_later(self.claim, time.time() + o.delay_seconds, o.reason, kind=o.kind, trace=trace)
        elif o.state == "dead":
            self.queue.leases.dead(self.claim, o.reason, kind=o.kind, trace=trace)
        elif o.state == "cancelled":
            self.queue.leases.cancelled(self.claim, o.reason, trace=trace)
        elif o.state == "released":
            self.queue.leases.release(self.claim, o.reason, count_attempt=False, kind=o.kind, trace=trace)

    def _write_progress(self) -> None:
        """The live progress, when it moved and a second has passed since the last write (fenced); the newest
        preview, at most every [runner] preview_seconds (fenced, not durable)."""
        run = self.live
        if run is not None and run.preview is not None and \
                self.clock() - self.preview_written_at >= self.s.preview_seconds:
            (node, content_type, image), run.preview = run.preview, None
            self.preview_written_at = self.clock()
            self.queue.previews.set_preview(self.claim, node, content_type, image)
        if not self.trace.changed or self.clock() - self.progress_written_at < PROGRESS_WRITE_SECONDS:
            return
        progress = self.trace.progress()
        self.trace.changed = False
        if progress is not None:
            self.progress_written_at = self.clock()
            self.queue.leases.set_progress(self.claim, progress)

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
                return Outcome("released", f"interrupted by a stop ({exc.what}) while {phase}; attempt not counted",
                               kind="shutdown")
            if stuck:
                return self._failed(Failure(STUCK_KIND, stuck, transient=True))
            return self._failed(Failure("timeout", f"timed out after {self.s.timeout_seconds:g} s (while {phase}: "
                                        "the server did not answer in time)", transient=True))

    def _steps(self) -> Outcome:
        run: Run | None = None
        try:
            run, followed = catch_up(self.ctx, self.posted_in)
            if followed:  # still in a server's queue: where, and its number, recorded before anything else
                assert run is not None and run.number is not None
                self.live = run
                self.queue.leases.record_prompt(self.claim, run.server, run.number, run.client.url,
                                                waiting=not run.started)
                self.waiting = not run.started  # still pending in that server's queue: shown posted until it runs
            if self.cancel_requested:
                self._interrupt(run)
                return Outcome("cancelled", "cancelled by user", kind="cancelled")
            if run is None:
                if self.claim.attempt > self.s.policy.attempts:
                    return Outcome("dead", gave_up(self.claim.attempt - 1, self.claim.last_reason), kind="gave_up")
                run = self._post()
            run, entry = self._follow_recovering(run)
            if self.waiting:  # over (adopted, or its start was not read): no longer waiting for its server
                self._executes()
            self.run_over = True
            if self.early.may_queue_behind_next(run):
                self.early.queue_behind_next(run)
            if self.early.may_hand_off(run):
                self.early.hand_off()
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
            memory.device_lost(exc.kind, exc.reason, self.s.server, self.station.memory)
            return self._failed(Failure(exc.kind, exc.reason, transient=not isinstance(exc, PermanentError)))
        finally:
            if run is not None and run.stream is not None and run.stream is not run.client.stream:
                run.stream.close()  # a followed run's own socket; the client's kept one stays open

    def _follow_recovering(self, run: Run) -> tuple[Run, dict[str, Any]]:
        """Follow ``run``; after an out-of-memory error, POST /free and post the job once more on this server, or
        give it back uncounted (comfysup.runner.memory.after_oom says which, and when neither). Returns the run
        that succeeded."""
        try:
            return run, self._follow(run)
        except ComfyError as exc:
            retried = self.oom_retried or (self.claim.last_reason or "").startswith(memory.RELEASED_REASON)
            action = memory.after_oom(exc.kind, retried, run.client is self.client, self.early.posted_out is not None)
            if action is None:
                raise
            self.oom_retried = True
            if not memory.free(self.client.free, self.s.server, self.station.memory):
                raise
            self.station.memory.count("oom_retries")
            if action == memory.RELEASE:
                raise Stop(Outcome("released", f"{memory.RELEASED_REASON} (last: {exc.reason})", kind="oom")) from exc
            if run.stream is not None and run.stream is not run.client.stream:
                run.stream.close()
            log.info("job %s attempt %d on %s: out of memory; POST /free, then posted again on this server "
                     "(not counted as an attempt)", self.claim.id, self.claim.attempt, self.s.server,
                     extra={"event": "oom_retry"})
        again = self._post(again=True)
        return again, self._follow(again)

    def _failed(self, failure: Failure) -> Outcome:
        decision = decide(self.s.policy, self.claim.attempt, failure)
        if decision.dead:
            return Outcome("dead", decision.reason, kind=failure.kind)
        return Outcome("retry", decision.reason, kind=failure.kind, delay_seconds=decision.delay_seconds)

    # -- 2. post ----------------------------------------------------------------------------------------

    def _post(self, again: bool = False) -> Run:
        """POST the job (``again``: once more in this attempt, after an out-of-memory error: a fresh client id,
        and the failed run's files out of the job's folder)."""
        if self.posted_in is not None:  # posted by the previous attempt as its own run ended
            posted, self.posted_in = self.posted_in, None
            if posted.error is not None:
                raise posted.error
            self.trace.phase("posted", posted.posted_at)
            self.live = Run(self.client, self.s.server, posted.number, stream=self.client.own_stream(drain=False),
                            started=posted.started, behind_lost=posted.behind_lost)
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

    def _executes(self) -> None:
        """The job's execution started (or its run is over) and the queue still shows it as posted: one fenced
        write, only when the attempt ahead of it did not record the start with its own end."""
        self.waiting = False
        self.queue.leases.set_waiting(self.claim, False)

    # -- 3. follow --------------------------------------------------------------------------------------

    def _read_buffered(self, run: Run) -> None:
        """The history said success before the socket's last messages were read (a poll comes on its own clock):
        what the socket already holds is read now, without waiting, so the trace closes its last nodes and a
        message of the job queued behind reaches that job's attempt."""
        for _ in range(1000):  # bounded: a server may keep sending (previews of the next prompt)
            if run.stream is None or (message := follow.receive(self.ctx, run, self.replay, 0.0)) is None:
                return
            if message.get("type") == "comfysup_reconnected":
                return
            follow.on_message(self.ctx, run, message, self.early)

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
                if run.success_seen and run.end_seen and follow.watched_whole(run):
                    return follow.entry_from_socket(self.ctx, run)
                try:
                    entry = follow.poll(self.ctx, run, self.early)
                    unreachable_since = None
                except ServerUnavailable as exc:
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since >= self.s.server_lost_seconds:
                        raise ServerUnavailable(f"the ComfyUI server died or stopped answering ({exc.reason})",
                                                "server_died") from exc
                    entry = None
                if entry is not None:
                    self._read_buffered(run)
                    return entry
                next_poll = now + (HISTORY_AFTER_SUCCESS_SECONDS if run.success_seen else self.s.poll_seconds)
            wait = max(0.0, min(next_poll, self.deadline, self.heartbeat.next) - self.clock())
            message = follow.receive(self.ctx, run, self.replay, wait)
            poll_in = None if message is None else follow.on_message(self.ctx, run, message, self.early)
            if self.early.may_queue_ahead(run):
                self.early.hand_off(run)  # this run executes: the next waits behind it in the server's queue
            if run.success_seen and self.early.may_hand_off(run):
                # execution_success, then the end with an empty queue: the server is idle from this moment, so
                # the next job goes to it before this run's history is read (that read costs the server a
                # round trip of idle time, and it comes next anyway).
                self.early.hand_off()
            if run.end_seen and self.early.may_queue_behind_next(run):
                # Ended, the job queued behind it starts: the one after that is queued before this run's history
                # is read, whose round trip would come first otherwise (a prompt of a few ms is over by then).
                if self.early.posted_out is not None and self.early.posted_out.started:
                    self.early.queue_behind_next(run)
                    poll_in = 0.0
                elif poll_in == 0.0:
                    poll_in = NEXT_START_WAIT_SECONDS  # its start comes next, unless the server lost it
            if poll_in is not None:
                next_poll = min(next_poll, self.clock() + poll_in)
            if run.started and self.waiting:  # after the posts above: the server's next job never waits for it
                self._executes()
            self._write_progress()

    def _checkpoints(self, run: Run, now: float) -> None:
        """The deadline, the heartbeat (lease, cancel) and a graceful stop, checked on every wake-up."""
        self.station.on_alive()
        self._write_progress()
        if self.heartbeat.due(now):
            self.early.renew_early(now)
            if self.queue.leases.heartbeat(self.claim, self.s.lease_seconds):
                self._interrupt_to_end(run)
                raise Stop(Outcome("cancelled", "cancelled by user", kind="cancelled"))
        if now >= self.deadline:
            stuck = self._interrupt_to_end(run)
            raise ComfyError(stuck, STUCK_KIND) if stuck else ComfyError(
                f"timed out after {self.s.timeout_seconds:g} s", "timeout")
        if self.early.posted_out is not None:
            self.early.give_to_waiting_peer(run, self.run_over)
        stop_at = self.station.stop_deadline()
        if (stop_at is not None and self.early.posted_out is not None and not self.early.posted_out.started
                and not (run.end_seen or run.success_seen or self.run_over)):
            # Queued behind this one, which still runs: it cannot have started, and gets no grace. Once this one
            # has ended it may run (its start unread): its own attempt follows it through the grace instead.
            self.early.withdraw_next(cancelled=False)
        if stop_at is not None and now >= stop_at:
            self._interrupt_to_end(run)
            raise Stop(Outcome("released", "interrupted by a graceful stop; attempt not counted", kind="shutdown"))

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
            if renew_now and not self.early.renewed_own(self.clock()):
                self.heartbeat.now(self.clock())
            self._checkpoints(run, self.clock())

        return download.download(self.ctx, run, entry, checkpoint)
